//go:build linux

package comm

import (
	"bytes"
	"net"
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

// findSysmon must find sysmon when it starts from sysmon's idle sleep on a
// rank bound to one CPU: at a rank's first group, the rank has just waited
// on the network with every P idle, so sysmon sleeps on a futex; the looks'
// own system calls wake it, but it runs only when this thread leaves the
// CPU, which the kernel need not do for it (on the 2-core reference VM,
// 400 looks back to back ended with sysmon still runnable in 6 of 10
// tries). Each try is a fresh copy of the test binary, bound to one CPU
// with GOMAXPROCS 1, that blocks in the network poller until the parent
// writes (its sysmon goes idle meanwhile) and then calls findSysmon.
func TestFindSysmonFromIdleSleep(t *testing.T) {
	if os.Getenv("GORUN_TEST_SYSMON_IDLE") != "" {
		findSysmonFromIdleSleep(t)
		return
	}
	for try := range 5 {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		mine, theirs := os.NewFile(uintptr(fds[0]), "parent"), os.NewFile(uintptr(fds[1]), "child")
		cmd := exec.Command(os.Args[0], "-test.run=^TestFindSysmonFromIdleSleep$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "GORUN_TEST_SYSMON_IDLE=1")
		cmd.ExtraFiles = []*os.File{theirs} // fd 3 in the child
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err = cmd.Start()
		_ = theirs.Close()
		if err != nil {
			_ = mine.Close()
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond) // the child blocks in its read, its sysmon goes idle
		_, werr := mine.Write([]byte{1})
		err = cmd.Wait()
		_ = mine.Close()
		if werr != nil || err != nil || !bytes.Contains(out.Bytes(), []byte("--- PASS: TestFindSysmonFromIdleSleep")) {
			t.Fatalf("try %d: write %v, child %v\n%s", try, werr, err, out.Bytes())
		}
	}
}

// findSysmonFromIdleSleep is the child's side of TestFindSysmonFromIdleSleep.
func findSysmonFromIdleSleep(t *testing.T) {
	var one unix.CPUSet
	var c uint32
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&c)), 0, 0); e != 0 {
		t.Fatal(e)
	}
	one.Set(int(c))
	for _, id := range threadIDs(t) {
		if err := unix.SchedSetaffinity(id, &one); err != nil {
			t.Fatal(err)
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ids := threadIDs(t)
	f := os.NewFile(3, "parent")
	conn, err := net.FileConn(f) // a pollable socket: the read below parks in the network poller
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if tid := findSysmon(); tid != ids[1] {
		t.Fatalf("findSysmon = %d, want %d (the first thread after main, threads %v)", tid, ids[1], ids)
	}
}
