//go:build linux

package comm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gorun-hpc/gorun/internal/owner"
)

// The sweep removes a segment only when its creator is gone from this PID
// namespace: one made in another namespace (a container sharing the host's
// /dev/shm) is never judged, whatever its pid means here; names made
// before the namespace was recorded are judged as before.
func TestSweepShmJudgesOnlyItsNamespace(t *testing.T) {
	if owner.PIDNamespace() == 0 {
		t.Skip("/proc/self/ns/pid cannot be read here")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid, ns := dead.Process.Pid, owner.PIDNamespace()
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		gone bool
	}{
		{fmt.Sprintf("gorun-%d.%d-0000000000000001-0-1-x", pid, ns), true},          // dead, here
		{fmt.Sprintf("gorun-%d.%d-0000000000000001-0-1-x", pid, ns+1), false},       // another namespace
		{fmt.Sprintf("gorun-%d-0000000000000001-0-1-x", pid), true},                 // old name, dead
		{fmt.Sprintf("gorun-%d.%d-0000000000000001-0-1-x", os.Getpid(), ns), false}, // alive
		{fmt.Sprintf("gorun-%d.0-0000000000000001-0-1-x", pid), false},              // namespace unknown
		{"gorun-notapid-1", false},
	} {
		if err := os.WriteFile(filepath.Join(dir, tc.name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, err := os.Stat(filepath.Join(dir, tc.name))
			if gone := os.IsNotExist(err); gone != tc.gone {
				t.Errorf("%s: removed %v, want %v", tc.name, gone, tc.gone)
			}
		}()
	}
	if n := sweepShm(dir); n != 2 {
		t.Errorf("sweep removed %d segments, want 2", n)
	}
	// What createShm names, the sweep reads back as this process's.
	seg, err := createShm(dir, 7, 0, 1, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.unmap()
	defer seg.unlink()
	if p, n, ok := shmOwner(seg.name[len(shmPrefix):]); !ok || p != os.Getpid() || n != ns {
		t.Fatalf("%s reads as pid %d namespace %d (%v), want %d %d", seg.name, p, n, ok, os.Getpid(), ns)
	}
}
