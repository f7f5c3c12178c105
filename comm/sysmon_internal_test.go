//go:build linux

package comm

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// quietSysmon must move exactly one of the threads that existed when it
// ran, the runtime's sysmon (the one that sleeps in nanosleep between its
// rounds), to SCHED_BATCH, and leave every other thread's policy alone.
//
// Threads sysmon creates inherit its policy, so once any test of this
// binary has made a shared-memory link (which quiets sysmon) the check
// cannot tell them apart: it runs in a fresh copy of the test binary.
func TestQuietSysmon(t *testing.T) {
	if os.Getenv("GORUN_TEST_SYSMON_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestQuietSysmon$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "GORUN_TEST_SYSMON_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestQuietSysmon")) {
			t.Fatalf("fresh process: %v\n%s", err, out)
		}
		return
	}
	if sysmonTID.Load() != 0 {
		t.Fatal("sysmon was quieted before the test ran")
	}
	before := threadIDs(t)
	quietSysmon()
	tid := int(sysmonTID.Load())
	if tid == 0 {
		t.Fatal("sysmon not found in a Go test binary")
	}
	moved := 0
	for _, id := range before {
		pol := threadPolicy(t, id)
		if id != tid {
			if pol != 0 {
				t.Errorf("thread %d has policy %d; only sysmon (%d) may leave SCHED_OTHER", id, pol, tid)
			}
			continue
		}
		moved++
		if pol != schedBatch {
			t.Errorf("sysmon (thread %d) has policy %d, want SCHED_BATCH (%d)", id, pol, schedBatch)
		}
	}
	if moved != 1 {
		t.Fatalf("thread %d is not among this process's threads %v", tid, before)
	}
	// It is sysmon: it keeps sleeping in nanosleep while this goroutine
	// runs (every other runtime thread parks in futex or runs Go code).
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/syscall")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(b, []byte(strconv.Itoa(unix.SYS_NANOSLEEP)+" ")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d never seen in nanosleep (last: %q)", tid, b)
		}
	}
}

// unbatch must put a thread that inherited SCHED_BATCH back to SCHED_OTHER
// (a shared-memory waiter is about to sleep on it, and its wake-up must
// preempt) and leave a normal thread normal.
func TestUnbatch(t *testing.T) {
	quietSysmon()
	if sysmonTID.Load() == 0 {
		t.Skip("sysmon not found")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // the thread exits with this goroutine: its policy goes with it
		me := unix.Gettid()
		var param [1]int32
		if _, _, e := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, 0, schedBatch, uintptr(unsafe.Pointer(&param[0]))); e != 0 {
			t.Errorf("setting SCHED_BATCH: %v", e)
			return
		}
		unbatch()
		if pol := threadPolicy(t, me); pol != 0 {
			t.Errorf("after unbatch a batch thread has policy %d, want SCHED_OTHER", pol)
		}
		unbatch()
		if pol := threadPolicy(t, me); pol != 0 {
			t.Errorf("unbatch of a normal thread left policy %d", pol)
		}
	}()
	<-done
}

func threadIDs(t *testing.T) []int {
	f, err := os.Open("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	names, err := f.Readdirnames(-1)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 0, len(names))
	for _, n := range names {
		id, err := strconv.Atoi(n)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// threadPolicy reads a thread's scheduling policy (field 41 of its stat
// line).
func threadPolicy(t *testing.T, tid int) int {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	n, err := strconv.Atoi(fields[38]) // field 41 overall; fields here start at 3
	if err != nil {
		t.Fatal(err)
	}
	return n
}
