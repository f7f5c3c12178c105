package program

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Resolve finds a program the way a shell would and refuses, with an
// *Error naming the program and the reason, whatever could not be run.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("prog", 0o755)
	write("data", 0o644)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skipf("no sh in PATH: %v", err)
	}
	for _, tc := range []struct {
		name, dir string
		want      string // the path, or the reason in the *Error
		fails     bool
	}{
		{name: "sh", want: sh},
		{name: "./prog", dir: dir, want: filepath.Join(dir, "prog")},
		{name: filepath.Join(dir, "prog"), dir: "/elsewhere", want: filepath.Join(dir, "prog")},
		{name: "", fails: true, want: "empty program name"},
		{name: "gorun-no-such-command", fails: true, want: "command not found in PATH"},
		{name: "./missing", dir: dir, fails: true, want: "no such file"},
		{name: "./sub", dir: dir, fails: true, want: "is a directory"},
		{name: "./data", dir: dir, fails: true, want: "permission denied (not executable)"},
	} {
		got, err := Resolve(tc.name, tc.dir)
		if !tc.fails {
			if err != nil || got != tc.want {
				t.Errorf("Resolve(%q, %q) = %q, %v; want %q", tc.name, tc.dir, got, err, tc.want)
			}
			continue
		}
		var pe *Error
		if !errors.As(err, &pe) || pe.Program != tc.name || pe.Err.Error() != tc.want || pe.ExitCode() != 127 {
			t.Errorf("Resolve(%q, %q) = %q, %v; want an *Error for %q: %s, exit code 127", tc.name, tc.dir, got, err, tc.name, tc.want)
		}
	}
}

func TestIsPath(t *testing.T) {
	for name, want := range map[string]bool{"prog": false, "./prog": true, "/bin/sh": true, "a/b": true, "": false} {
		if got := IsPath(name); got != want {
			t.Errorf("IsPath(%q) = %v, want %v", name, got, want)
		}
	}
}

// A program that needs an Open MPI library is refused with ErrOpenMPI and
// the library named; one that needs none, or is not ELF, passes.
func TestCheckOpenMPI(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{script, "/bin/sh"} {
		if err := CheckOpenMPI(p, p); err != nil {
			t.Errorf("CheckOpenMPI(%s) = %v; want it to pass", p, err)
		}
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("no gcc to build a program linked against a stand-in libmpi.so.40: %v", err)
	}
	src := filepath.Join(dir, "main.c")
	if err := os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-shared", "-fPIC", "-Wl,-soname,libmpi.so.40", "-o", filepath.Join(dir, "libmpi.so.40"), src},
		{"-o", filepath.Join(dir, "ompi"), src, "-Wl,--no-as-needed", filepath.Join(dir, "libmpi.so.40")},
	} {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			t.Skipf("gcc %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	err = CheckOpenMPI("./ompi", filepath.Join(dir, "ompi"))
	var pe *Error
	if !errors.Is(err, ErrOpenMPI) || !errors.As(err, &pe) || pe.Program != "./ompi" || !strings.Contains(err.Error(), "it needs libmpi.so.40") {
		t.Fatalf("CheckOpenMPI of a program linked against libmpi.so.40 = %v; want an *Error wrapping ErrOpenMPI naming the library", err)
	}
}
