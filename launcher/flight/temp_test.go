package flight

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
func TestSweep(t *testing.T) {
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
	sweep(dir, ns, func(pid int) bool { return pid == dead })
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
	sweep(dir, 0, func(int) bool { return true })
	if _, err := os.Lstat(again); err != nil {
		t.Errorf("swept with no namespace: %v", err)
	}
}

// MakeTemp names its directory after this process, so that a later
// one can tell when it is stale, and owner.Gone tells a live pid from a
// reaped one.
func TestMakeTemp(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	d, err := MakeTemp()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("gorun-flight-%d-%d-", owner.PIDNamespace(), os.Getpid())
	if owner.PIDNamespace() == 0 || !strings.HasPrefix(filepath.Base(d.Path()), want) || d.Temp() != d.Path() {
		t.Errorf("made %s (temp %q), want a name starting %s", d.Path(), d.Temp(), want)
	}
	// Its maker removes it; a directory the caller keeps stays.
	kept := At(t.TempDir())
	kept.Remove()
	if _, err := os.Stat(kept.Path()); err != nil || kept.Temp() != "" {
		t.Errorf("Remove of a kept directory: %v (temp %q)", err, kept.Temp())
	}
	d.Remove()
	if _, err := os.Stat(d.Path()); !os.IsNotExist(err) {
		t.Errorf("Remove left %s (%v)", d.Path(), err)
	}
	if owner.Gone(os.Getpid(), owner.PIDNamespace()) {
		t.Error("this process counted as gone")
	}
}
