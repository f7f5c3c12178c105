package supervisor

import (
	"bufio"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/pmi"
)

// The supervisor's PMI sockets wait in one goroutine until their rank
// speaks: 200 silent ranks cost no goroutine each; a rank that speaks is
// served at once; a rank that exits without a word has its serving end
// (settle returns at once); close ends the rest and leaves no descriptor
// and no goroutine.
func TestPMISocketsWaitUntilRankSpeaks(t *testing.T) {
	const ranks = 200
	fdsBefore, _ := os.ReadDir("/proc/self/fd")
	mapping, err := pmi.ProcessMapping([]int{ranks})
	if err != nil {
		t.Fatal(err)
	}
	job := &wire.PMIJob{KVSName: "gorun-wait", Size: ranks, Mapping: mapping}
	var rs []wire.SupervisorRank
	for r := range ranks {
		rs = append(rs, wire.SupervisorRank{Rank: r})
	}
	g0 := runtime.NumGoroutine()
	sp, err := NewPMI(*job, rs, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if sp.waiter == nil {
		t.Fatal("no waiter: every socket got a goroutine from the start")
	}
	if g := runtime.NumGoroutine() - g0; g > 2 {
		t.Errorf("%d goroutines for %d silent PMI sockets, want 1", g, ranks)
	}

	// Rank 7 speaks: it is answered.
	end, err := net.FileConn(sp.ends[7]) // a duplicate that takes a deadline
	if err != nil {
		t.Fatal(err)
	}
	sp.Started(7)
	if _, err := end.Write([]byte("cmd=init pmi_version=1 pmi_subversion=1\n")); err != nil {
		t.Fatal(err)
	}
	_ = end.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(end).ReadString('\n')
	if err != nil || !strings.Contains(line, "cmd=response_to_init") || !strings.Contains(line, "rc=0") {
		t.Fatalf("rank 7's init: %q, %v", line, err)
	}
	if in, _ := sp.srv.State(7); !in {
		t.Error("rank 7's init not recorded")
	}
	// Rank 9 exits without a word: its end closes (the supervisor's
	// copy and the rank's), and its serving ends.
	sp.Started(9)
	start := time.Now()
	sp.settle(9, 5*time.Second)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("settle of a silent exited rank took %v", d)
	}
	select {
	case <-sp.served[9]:
	default:
		t.Error("rank 9's serving did not end on its hang-up")
	}
	select {
	case <-sp.served[8]:
		t.Error("rank 8's serving ended though it is alive and silent")
	default:
	}
	end.Close()
	sp.Close()
	for r, ch := range sp.served {
		select {
		case <-ch:
		default:
			t.Errorf("rank %d's serving still open after close", r)
		}
	}
	if fdsAfter, _ := os.ReadDir("/proc/self/fd"); len(fdsAfter) != len(fdsBefore) {
		t.Errorf("%d descriptors before and %d after", len(fdsBefore), len(fdsAfter))
	}
	// A goroutine whose serving ended may still be returning: wait for
	// the count to come down; a goroutine left blocked never does.
	g := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); g > g0 && time.Now().Before(deadline); g = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if g > g0 {
		t.Errorf("%d goroutines 5 s after close, %d before", g, g0)
	}
}
