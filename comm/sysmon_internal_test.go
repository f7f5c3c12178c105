//go:build linux

package comm

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// quietSysmon must lower exactly one thread, the runtime's sysmon (the
// one that sleeps in nanosleep between its rounds), and leave every
// thread that may run goroutines at its priority.
func TestQuietSysmon(t *testing.T) {
	quietSysmon(19)
	if sysmonTID == 0 {
		t.Fatal("sysmon not found in a Go test binary")
	}
	f, err := os.Open("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	tids, _ := f.Readdirnames(-1)
	_ = f.Close()
	lowered := 0
	base := threadNice(t, strconv.Itoa(os.Getpid())) // the test may run under nice
	for _, tid := range tids {
		nice := threadNice(t, tid)
		if tid != strconv.Itoa(sysmonTID) {
			if nice != base {
				t.Errorf("thread %s has nice %d; only sysmon (%d) may be lowered", tid, nice, sysmonTID)
			}
			continue
		}
		lowered++
		if nice != 19 {
			t.Errorf("sysmon (thread %s) has nice %d, want 19", tid, nice)
		}
	}
	if lowered != 1 {
		t.Fatalf("thread %d is not among this process's threads", sysmonTID)
	}
	// It is sysmon: it keeps sleeping in nanosleep while this goroutine
	// runs (every other runtime thread parks in futex or runs Go code).
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(sysmonTID) + "/syscall")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(b, []byte("35 ")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d never seen in nanosleep (last: %q)", sysmonTID, b)
		}
	}
}

// threadNice reads a thread's nice value (field 19 of its stat line).
func threadNice(t *testing.T, tid string) int {
	b, err := os.ReadFile("/proc/self/task/" + tid + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	n, err := strconv.Atoi(fields[16]) // field 19 overall; fields here start at 3
	if err != nil {
		t.Fatal(err)
	}
	return n
}
