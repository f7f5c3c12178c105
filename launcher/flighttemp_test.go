package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/internal/owner"
)

// A new flight directory removes those of processes that are gone in this
// PID namespace, and leaves a live process's, another namespace's, and any
// name it does not own or cannot parse.
func TestSweepFlightTemps(t *testing.T) {
	dir := t.TempDir()
	const ns = 4026531836
	dead, alive := 1_000_001, 1_000_002
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "ready.1"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := mk(fmt.Sprintf("gorun-flight-%d-%d-123", ns, dead))
	keep := []string{
		mk(fmt.Sprintf("gorun-flight-%d-%d-456", ns, alive)),     // its process runs
		mk(fmt.Sprintf("gorun-flight-%d-%d-789", ns+1, dead)),    // another PID namespace
		mk(fmt.Sprintf("gorun-flight-%d-%d-1", ns, os.Getpid())), // this process's own
		mk("gorun-flight-2264272946"),                            // an older gorun's name
	}
	// A file, not a directory, with a stale name: not ours to remove.
	file := filepath.Join(dir, fmt.Sprintf("gorun-flight-%d-%d-9", ns, dead))
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, file)
	sweepFlightTemps(dir, ns, func(pid int) bool { return pid == dead })
	if _, err := os.Lstat(gone); !os.IsNotExist(err) {
		t.Errorf("%s of a gone process is still there (%v)", gone, err)
	}
	for _, p := range keep {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	// Without a namespace to match, nothing goes.
	again := mk(fmt.Sprintf("gorun-flight-%d-%d-321", ns, dead))
	sweepFlightTemps(dir, 0, func(int) bool { return true })
	if _, err := os.Lstat(again); err != nil {
		t.Errorf("swept with no namespace: %v", err)
	}
}

// makeFlightTemp names its directory after this process, so that a later
// one can tell when it is stale, and owner.Gone tells a live pid from a
// reaped one.
func TestMakeFlightTemp(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	d, err := makeFlightTemp()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("gorun-flight-%d-%d-", owner.PIDNamespace(), os.Getpid())
	if owner.PIDNamespace() == 0 || !strings.HasPrefix(filepath.Base(d), want) {
		t.Errorf("made %s, want a name starting %s", d, want)
	}
	if owner.Gone(os.Getpid(), owner.PIDNamespace()) {
		t.Error("this process counted as gone")
	}
}
