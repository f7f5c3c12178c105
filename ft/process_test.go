package ft_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/ft"
)

// incKey names one process: a replica's incarnation.
type incKey struct{ replica, inc int }

// jobResult is what a process job printed and the service recorded.
type jobResult struct {
	out  map[incKey][]string // each incarnation's stdout lines
	code map[incKey]int      // its exit code (-1: killed)
	rec  ft.Record
}

// runProcJob runs n replicas of the worker as real processes, each for
// steps steps, and does what gorun --fault-tolerant does on a death: tell
// the service, start the next incarnation. kills says which incarnation
// dies where (FT_KILL).
func runProcJob(t *testing.T, n int, steps int, kills map[incKey]string) jobResult {
	t.Helper()
	s := newServer(t, n)
	res := jobResult{out: map[incKey][]string{}, code: map[incKey]int{}}
	type exit struct {
		k   incKey
		err error
		out *bytes.Buffer
	}
	exits := make(chan exit, 64)
	running := 0
	start := func(k incKey) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &prefixWriter{t: t, prefix: fmt.Sprintf("replica %d.%d: ", k.replica, k.inc)}
		cmd.Env = append(os.Environ(), workerEnv+"=1", "FT_STEPS="+strconv.Itoa(steps), "FT_KILL="+kills[k])
		for name, v := range replicaEnv(s, k.replica, n, k.inc) {
			cmd.Env = append(cmd.Env, name+"="+v)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		running++
		go func() { exits <- exit{k, cmd.Wait(), &out} }() // owned: drained below
	}
	for r := range n {
		start(incKey{r, 0})
	}
	deadline := time.After(90 * time.Second)
	for running > 0 {
		select {
		case e := <-exits:
			running--
			res.out[e.k] = strings.Split(strings.TrimSpace(e.out.String()), "\n")
			var ee *exec.ExitError
			switch {
			case e.err == nil:
				res.code[e.k] = 0
			case errors.As(e.err, &ee):
				res.code[e.k] = ee.ExitCode()
				s.Lost(e.k.replica, e.k.inc, e.err.Error())
				if e.k.inc < 4 {
					start(incKey{e.k.replica, e.k.inc + 1})
				}
			default:
				t.Fatal(e.err)
			}
		case <-deadline:
			t.Fatal("the job did not finish in 90 s")
		}
	}
	res.rec = s.Record()
	return res
}

type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(b), nil
}

// checkEqual asserts that the last incarnation of every replica ended at
// steps with the same digest, and returns it.
func checkEqual(t *testing.T, res jobResult, n, steps int) {
	t.Helper()
	var digests []string
	for r := range n {
		last := 0
		for k := range res.code {
			if k.replica == r && k.inc > last {
				last = k.inc
			}
		}
		k := incKey{r, last}
		if res.code[k] != 0 {
			t.Fatalf("replica %d incarnation %d exited %d", r, last, res.code[k])
		}
		lines := res.out[k]
		f := strings.Fields(lines[len(lines)-1])
		if len(f) != 4 || f[0] != "digest" || f[2] != strconv.Itoa(steps) {
			t.Fatalf("replica %d incarnation %d ended with %q, want its digest at step %d", r, last, lines[len(lines)-1], steps)
		}
		digests = append(digests, f[3])
	}
	for r, d := range digests {
		if d != digests[0] {
			t.Errorf("replica %d's state %s differs from replica 0's %s: the replicas are not bitwise equal", r, d, digests[0])
		}
	}
}

// stepLine returns the line a process printed for step (the quorum's
// starting committed step), the last one if it retried.
func stepLines(lines []string, step int) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "step "+strconv.Itoa(step)+" ") {
			out = append(out, l)
		}
	}
	return out
}

// TestHealAfterKill: replica 1 dies between its all-reduce and its vote
// at step 4. The survivors do not commit that step (the quorum's
// promise), keep stepping without restarting, and replica 1's
// replacement heals from them: every replica ends bitwise equal.
func TestHealAfterKill(t *testing.T) {
	const n, steps = 3, 24
	res := runProcJob(t, n, steps, map[incKey]string{{1, 0}: "reduce:4"})
	checkEqual(t, res, n, steps)
	for _, r := range []int{0, 2} {
		if _, ok := res.code[incKey{r, 1}]; ok {
			t.Errorf("survivor %d was restarted", r)
		}
		ls := stepLines(res.out[incKey{r, 0}], 4)
		if len(ls) < 2 || !strings.HasSuffix(ls[0], "committed false healed false") || !strings.Contains(ls[0], "size 3") {
			t.Errorf("survivor %d at step 4: %q; want the 3-replica step uncommitted, then a retry", r, ls)
		}
		if !strings.Contains(ls[len(ls)-1], "committed true") {
			t.Errorf("survivor %d never committed step 4 after the loss: %q", r, ls)
		}
	}
	first := res.out[incKey{1, 1}][0]
	if !strings.Contains(first, "healed true") {
		t.Errorf("replacement's first step: %q, want a heal", first)
	}
	if len(res.rec.Heals) != 1 || res.rec.Heals[0].Replica != 1 || res.rec.Heals[0].Incarnation != 1 {
		t.Errorf("heals recorded: %+v", res.rec.Heals)
	}
	if len(res.rec.Losses) != 1 || len(res.rec.Uncommitted) != 1 || res.rec.Uncommitted[0].Step != 4 {
		t.Errorf("losses %+v, uncommitted %+v; want one loss and step 4 uncommitted", res.rec.Losses, res.rec.Uncommitted)
	}
	if len(res.rec.Heals) == 0 {
		return
	}
	// Sharded: each survivor sent its half of the state, by its own count.
	var served []int64
	for _, sv := range res.rec.Served {
		served = append(served, sv.Bytes)
	}
	total := res.rec.Heals[0].Bytes
	if len(served) != 2 || served[0]+served[1] != total || served[0] < total/2-1 || served[1] < total/2-1 {
		t.Errorf("the sources served %v bytes of a %d-byte state; want two halves", served, total)
	}
	if h := res.rec.Heals[0]; !slices.Equal(h.Sources, []int{0, 2}) {
		t.Errorf("heal sources %v, want both survivors [0 2] (sharded)", h.Sources)
	}
}

// TestKillDuringHeal: the replacement dies while loading the healed
// state; its own replacement heals, and everyone ends equal.
func TestKillDuringHeal(t *testing.T) {
	const n, steps = 3, 24
	res := runProcJob(t, n, steps, map[incKey]string{{1, 0}: "reduce:3", {1, 1}: "load"})
	checkEqual(t, res, n, steps)
	if res.code[incKey{1, 1}] != -1 {
		t.Errorf("incarnation 1 exited %d, want killed in its heal", res.code[incKey{1, 1}])
	}
	if len(res.rec.Heals) != 1 || res.rec.Heals[0].Incarnation != 2 {
		t.Errorf("heals recorded: %+v, want one, by incarnation 2", res.rec.Heals)
	}
}

// TestKillHealSource: a heal source dies while serving the heal; the
// heal fails cleanly, is retried from the remaining source, and the dead
// source's own replacement heals later.
func TestKillHealSource(t *testing.T) {
	const n, steps = 3, 24
	res := runProcJob(t, n, steps, map[incKey]string{{1, 0}: "reduce:3", {2, 0}: "save"})
	checkEqual(t, res, n, steps)
	if res.code[incKey{2, 0}] != -1 {
		t.Errorf("source replica 2 exited %d, want killed while serving", res.code[incKey{2, 0}])
	}
	var healed []incKey
	for _, h := range res.rec.Heals {
		healed = append(healed, incKey{h.Replica, h.Incarnation})
		if h.Replica == 1 && !slices.Equal(h.Sources, []int{0}) {
			t.Errorf("replica 1 healed from %v, want the remaining source [0]", h.Sources)
		}
	}
	if !slices.Contains(healed, incKey{1, 1}) || !slices.Contains(healed, incKey{2, 1}) {
		t.Errorf("heals %v, want replica 1 and 2's replacements", healed)
	}
}
