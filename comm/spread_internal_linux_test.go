//go:build linux

package comm

import (
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Consecutive blocks of the host's ranks per CPU, over the CPUs allowed.
func TestSpreadCPU(t *testing.T) {
	for _, tc := range []struct {
		local int
		cpus  []int
		want  []int
	}{
		{4, []int{0, 1}, []int{0, 0, 1, 1}},
		{3, []int{0, 1}, []int{0, 0, 1}},
		{7, []int{0, 1}, []int{0, 0, 0, 0, 1, 1, 1}},
		{4, []int{2, 5}, []int{2, 2, 5, 5}},
		{6, []int{0, 1, 2, 3}, []int{0, 0, 1, 2, 2, 3}},
	} {
		for idx, w := range tc.want {
			if got := spreadCPU(idx, tc.local, tc.cpus); got != w {
				t.Errorf("spreadCPU(%d, %d, %v) = %d, want %d", idx, tc.local, tc.cpus, got, w)
			}
		}
	}
	if got := spreadCPU(0, 4, nil); got != -1 {
		t.Errorf("spreadCPU with no CPUs = %d, want -1", got)
	}
}

// spreadTo moves the calling thread (every thread of the process) to its
// CPU and leaves each thread's affinity as it was: a start, not a binding.
func TestSpreadToMovesAndUnbinds(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Skip("sched_getaffinity:", err)
	}
	var cpus []int
	for c := range 8 * int(unsafe.Sizeof(old)) {
		if old.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		t.Skip("needs two CPUs, has", cpus)
	}
	getcpu := func() int {
		var cpu uint32
		if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 {
			t.Fatal("getcpu:", e)
		}
		return int(cpu)
	}
	// Aim each round at a CPU other than the one the thread is on, so
	// that only a move can make the check pass.
	for round := range 4 {
		now := getcpu()
		idx := 0
		for i, c := range cpus {
			if c != now {
				idx = i
				break
			}
		}
		want := cpus[idx]
		// Two ranks per CPU: the first two on cpus[0], and so on.
		got := spreadTo(2*idx, 2*len(cpus))
		at := getcpu()
		if got != want {
			t.Fatalf("round %d: spreadTo(%d, %d) = %d, want %d", round, 2*idx, 2*len(cpus), got, want)
		}
		// The kernel may move the thread again once its affinity is
		// wide, but not within the few instructions since.
		if at != want {
			t.Fatalf("round %d: thread on CPU %d after spreadTo, want %d (was on %d)", round, at, want, now)
		}
		var after unix.CPUSet
		if err := unix.SchedGetaffinity(0, &after); err != nil {
			t.Fatal(err)
		}
		if after != old {
			t.Fatalf("round %d: affinity after spreadTo is %v, want the old %v back", round, after, old)
		}
	}
}

// Fewer than two ranks per CPU: no move (3 ranks on 2 CPUs measured slower
// spread).
func TestSpreadToLeavesFewRanks(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil || set.Count() < 2 {
		t.Skip("needs two CPUs")
	}
	if got := spreadTo(2*set.Count()-1, 2*set.Count()-1); got != -1 {
		t.Fatalf("spreadTo with %d ranks on %d CPUs moved to CPU %d, want no move", 2*set.Count()-1, set.Count(), got)
	}
}

// rehome moves a crowded waiter's thread to the home CPU, unbound, once per
// thread: the same thread found elsewhere again stays where the kernel put
// it.
func TestRehomeOncePerThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil || old.Count() < 2 {
		t.Skip("needs two CPUs")
	}
	saveHome, saveTID := homeCPU.Load(), homedTID.Load()
	defer func() { homeCPU.Store(saveHome); homedTID.Store(saveTID) }()
	getcpu := func() uint32 {
		var cpu uint32
		if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 {
			t.Fatal("getcpu:", e)
		}
		return cpu
	}
	moveTo := func(cpu int) {
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			t.Fatal(err)
		}
		if err := unix.SchedSetaffinity(0, &old); err != nil {
			t.Fatal(err)
		}
	}
	now := getcpu()
	home := -1
	for c := range 8 * int(unsafe.Sizeof(old)) {
		if old.IsSet(c) && c != int(now) {
			home = c
			break
		}
	}
	homeCPU.Store(0)
	homedTID.Store(0)
	rehome(now)
	if at := getcpu(); at != now {
		t.Fatalf("no home: rehome moved the thread from %d to %d", now, at)
	}
	homeCPU.Store(int32(home + 1))
	// A process that holds several ranks (several live endpoints) is
	// not one rank's: no thread of it is moved.
	saveLive := liveEndpoints.Load()
	liveEndpoints.Store(2)
	rehome(now)
	liveEndpoints.Store(saveLive)
	if at := getcpu(); at != now {
		t.Fatalf("with two endpoints in the process rehome moved the thread from %d to %d", now, at)
	}
	homedTID.Store(0)
	rehome(now)
	if at := getcpu(); at != uint32(home) {
		t.Fatalf("thread on CPU %d after rehome, want home %d (was on %d)", at, home, now)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil || after != old {
		t.Fatalf("affinity after rehome %v (%v), want the old %v", after, err, old)
	}
	moveTo(int(now))
	rehome(now)
	if at := getcpu(); at != now {
		t.Fatalf("second rehome of the same thread moved it from %d to %d, want once per thread", now, at)
	}
}
