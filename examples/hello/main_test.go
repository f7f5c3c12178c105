package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// The README shows this program as the Go way in: what it shows must be
// this file, and the file must run under gorun and print the right sums.
func TestHelloUnderGorun(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The README shows the program from "package main" on (the file's
	// doc comment is left out there).
	shown := src[bytes.Index(src, []byte("package main")):]
	if !bytes.Contains(readme, append(append([]byte("```go\n"), shown...), "```"...)) {
		t.Errorf("README.md does not show examples/hello/main.go as it is (from package main on, in a go block)")
	}
	if testing.Short() {
		t.Skip("builds gorun and hello")
	}
	dir := launchertest.Build(t, "cmd/gorun", "examples/hello")
	cmd := exec.Command(dir+"/gorun", "-np", "3", dir+"/hello")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gorun -np 3 hello: %v\n%s", err, out)
	}
	for r := range 3 {
		want := fmt.Sprintf("rank %d of 3: sum of 1..3 = 6", r)
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^rank \d of 3`).FindAll(out, -1)); n != 3 {
		t.Errorf("%d result lines, want 3:\n%s", n, out)
	}
}
