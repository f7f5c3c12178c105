package chaos

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// A segment counts as left behind only when its creator is gone: one of a
// live process (another test package's job, running beside this one) is
// not, whichever way its name records the creator.
func TestNewEntriesJudgesCreators(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	me, gone := strconv.Itoa(os.Getpid()), strconv.Itoa(dead.Process.Pid)
	ns := pidNamespace()
	if ns == "" {
		t.Skip("no /proc/self/ns/pid")
	}
	names := map[string]bool{
		"gorun-" + me + "." + ns + "-00ff-4-5-live":   false,
		"gorun-" + me + "-00ff-4-5-live-old-form":     false,
		"gorun-" + gone + "." + ns + "-00ff-6-7-dead": true,
		"gorun-" + gone + "-00ff-6-7-dead-old-form":   true,
		"gorun-" + gone + ".1-00ff-6-7-other-ns":      false,
	}
	after := map[string]bool{}
	for n := range names {
		p := filepath.Join("/dev/shm", n)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Skip("cannot write /dev/shm:", err)
		}
		t.Cleanup(func() { os.Remove(p) })
		after[n] = true
	}
	var want []string
	for n, left := range names {
		if left {
			want = append(want, n)
		}
	}
	slices.Sort(want)
	if got := newEntries(map[string]bool{}, after); !slices.Equal(got, want) {
		t.Errorf("newEntries = %v, want %v", got, want)
	}
}
