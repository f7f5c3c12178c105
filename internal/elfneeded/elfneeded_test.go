package elfneeded

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
)

// Find answers from the program's own needed libraries, and finds nothing
// in a file that is not ELF, one that is missing, or when nothing matches.
func TestFind(t *testing.T) {
	const sh = "/bin/sh"
	f, err := elf.Open(sh)
	if err != nil {
		t.Skipf("%s is not an ELF file here: %v", sh, err)
	}
	needed, _ := f.ImportedLibraries()
	f.Close()
	if len(needed) == 0 {
		t.Skipf("%s is statically linked: nothing to find", sh)
	}
	want := needed[len(needed)-1]
	if got, chain := Find(sh, func(s string) bool { return s == want }); got != want || len(chain) != 0 {
		t.Errorf("Find(%s, %s) = %q, %v; want it directly", sh, want, got, chain)
	}
	if got, chain := Find(sh, func(string) bool { return false }); got != "" || chain != nil {
		t.Errorf("a match for nothing found %q through %v", got, chain)
	}
	script := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{script, filepath.Join(t.TempDir(), "missing")} {
		if got, _ := Find(p, func(string) bool { return true }); got != "" {
			t.Errorf("Find(%s) = %q: a file that is not ELF needs nothing", p, got)
		}
	}
}
