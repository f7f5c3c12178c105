package supervisor

import (
	"os"
	"testing"
)

// Each fact is read once per path, whatever the answer, and a fact never
// asked for is never read.
func TestProgramFactsReadOnce(t *testing.T) {
	var f fact
	reads := 0
	for range 3 {
		if f.get(func() bool { reads++; return false }) {
			t.Fatal("a fact read as false came back true")
		}
	}
	if reads != 1 {
		t.Fatalf("read %d times, want once", reads)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ps := programs{}
	p := ps.of(self)
	if ps.of(self) != p {
		t.Fatal("a second lookup made a second record")
	}
	// This test binary is built from gorun's module.
	if !p.onRuntime() {
		t.Fatal("the launcher's own test binary is not seen as built on gorun's runtime")
	}
	if p.hwloc != factUnread {
		t.Fatal("asking one fact read another")
	}
	if ps.of("/bin/sh").onRuntime() {
		t.Fatal("/bin/sh seen as built on gorun's runtime")
	}
}
