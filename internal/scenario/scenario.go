// Package scenario is the golden-file test harness shared by the planning
// packages (stepgraph, buckets), in the manner of cockroachdb/datadriven as
// etcd-io/raft uses it: each case is a command line, input lines, a "----"
// line and the expected output up to a blank line. `go test -rewrite`
// rewrites the expected outputs so that changes are reviewed as diffs. It is
// written here, not imported, to keep the module's dependencies unchanged.
//
// It is test support: only _test.go files import it. Importing it registers
// the -rewrite flag.
package scenario

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of testdata scenario files")

// Case is one scenario: its command, arguments and input lines.
type Case struct {
	Pos   string // file:line of the command, for failure messages
	Cmd   string
	Args  map[string]string
	Words []string // the arguments in order
	Input string
}

// Run runs every scenario file matching glob as a subtest; run returns the
// output of one case, compared with (or, with -rewrite, written as) the
// expected output.
func Run(t *testing.T, glob string, run func(t *testing.T, sc Case) string) {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files match %s (%v)", glob, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runFile(t, f, run) })
	}
}

func runFile(t *testing.T, path string, run func(t *testing.T, sc Case) string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out []string
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			out = append(out, l)
			i++
			continue
		}
		sc := Case{Pos: path + ":" + itoa(i+1), Args: map[string]string{}}
		f := strings.Fields(l)
		sc.Cmd, sc.Words = f[0], f[1:]
		for _, a := range f[1:] {
			k, v, _ := strings.Cut(a, "=")
			sc.Args[k] = v
		}
		out = append(out, l)
		i++
		var in []string
		for i < len(lines) && lines[i] != "----" {
			in = append(in, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s: missing ----", sc.Pos)
		}
		out = append(out, in...)
		out = append(out, "----")
		i++
		var want []string
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			want = append(want, lines[i])
			i++
		}
		sc.Input = strings.Join(in, "\n")
		got := strings.TrimRight(run(t, sc), "\n")
		// Blank lines would end the case; they never carry meaning in our
		// outputs, so they are dropped.
		var gl []string
		for _, g := range strings.Split(got, "\n") {
			if strings.TrimSpace(g) != "" {
				gl = append(gl, g)
			}
		}
		got = strings.Join(gl, "\n")
		if *rewrite {
			out = append(out, gl...)
			continue
		}
		if w := strings.Join(want, "\n"); got != w {
			t.Errorf("%s: %s\n--- got\n%s\n--- want\n%s", sc.Pos, l, got, w)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}
