package hostlist

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// expandCases are valid expressions with their expansion. Those marked
// slurm are also checked against scontrol where SLURM is installed; the
// others use gorun's extension (text after a bracket group), which SLURM
// 22.05 rejects.
var expandCases = []struct {
	expr  string
	want  []string
	slurm bool
}{
	{"n1", []string{"n1"}, true},
	{"localhost", []string{"localhost"}, true},
	{"a,b,a", []string{"a", "b", "a"}, true},       // duplicates kept: rank order
	{"n[3,1,2]", []string{"n3", "n1", "n2"}, true}, // never sorted
	{"vm,n[01-03,7]", []string{"vm", "n01", "n02", "n03", "n7"}, true},
	{"n[08-11]", []string{"n08", "n09", "n10", "n11"}, true},
	{"n[8-11]", []string{"n8", "n9", "n10", "n11"}, true},
	{"n[008-10]", []string{"n008", "n009", "n010"}, true},
	{"n[1-010]", []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"}, true},
	{"n[5-5]", []string{"n5"}, true},
	{"n[0]", []string{"n0"}, true},
	{"r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}, true},
	{"a[1-3]b[4-5]", []string{"a1b4", "a1b5", "a2b4", "a2b5", "a3b4", "a3b5"}, true},
	{"r[1-2]n[7,3]", []string{"r1n7", "r1n3", "r2n7", "r2n3"}, true},
	// Three groups and more: last fastest, then first, second, ...
	{"x[1-2]y[1-2]z[1-2]", []string{"x1y1z1", "x1y1z2", "x2y1z1", "x2y1z2", "x1y2z1", "x1y2z2", "x2y2z1", "x2y2z2"}, true},
	{"a[1-2]b[1-2]c[0]", []string{"a1b1c0", "a2b1c0", "a1b2c0", "a2b2c0"}, true},
	{"a[1-3]b[4-5]c[6]", []string{"a1b4c6", "a2b4c6", "a3b4c6", "a1b5c6", "a2b5c6", "a3b5c6"}, true},
	{"a[1-2]b[3-4]c[5-6]d[7-8]", []string{
		"a1b3c5d7", "a1b3c5d8", "a2b3c5d7", "a2b3c5d8", "a1b4c5d7", "a1b4c5d8", "a2b4c5d7", "a2b4c5d8",
		"a1b3c6d7", "a1b3c6d8", "a2b3c6d7", "a2b3c6d8", "a1b4c6d7", "a1b4c6d8", "a2b4c6d7", "a2b4c6d8"}, true},
	{"[1-3]", []string{"1", "2", "3"}, true},
	{"n1[1-2]", []string{"n11", "n12"}, true},
	{"n[1,1]", []string{"n1", "n1"}, true},
	{"node-1.example.org", []string{"node-1.example.org"}, true},
	// gorun's extension: text after a bracket group.
	{"n[1-2]-ib", []string{"n1-ib", "n2-ib"}, false},
	{"gpu[1-2],cpu[01-02].cluster", []string{"gpu1", "gpu2", "cpu01.cluster", "cpu02.cluster"}, false},
	{"r[1-2]n[7,3]x", []string{"r1n7x", "r1n3x", "r2n7x", "r2n3x"}, false},
}

func TestExpand(t *testing.T) {
	for _, tc := range expandCases {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := Expand(tc.expr)
			if err != nil {
				t.Fatalf("Expand(%q): %v", tc.expr, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Expand(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
}

// TestSyntaxErrors: every syntax error of the package's two parsers is an
// *Error naming the parser, the input and the offset, with a message that
// says what was wrong there, and wraps ErrTooLarge exactly when the input
// asks for more than a cap.
func TestSyntaxErrors(t *testing.T) {
	parsers := map[string]func(string) (any, error){
		"hostlist":       func(s string) (any, error) { return Expand(s) },
		"tasks-per-node": func(s string) (any, error) { return ParseTasksPerNode(s) },
	}
	for _, tc := range []struct {
		what    string // the parser, as Error.What names it
		in      string
		pos     int
		msg     string // substring of Msg
		tooMany bool
	}{
		{"hostlist", "", 0, "empty expression", false},
		{"hostlist", "n[1-3", 1, "'[' is never closed", false},
		{"hostlist", "n1-3]", 4, "']' without a matching '['", false},
		{"hostlist", "n[1[2]]", 3, "nested '['", false},
		{"hostlist", "a,,b", 2, "empty element", false},
		{"hostlist", ",a", 0, "empty element", false},
		{"hostlist", "a,", 2, "empty element, expected a host name after ','", false},
		{"hostlist", "n[]", 1, "empty brackets", false},
		{"hostlist", "n[5-3]", 4, "range 5-3 goes backwards", false},
		{"hostlist", "n[1-]", 4, "expected a number after '-', found ']'", false},
		{"hostlist", "n[-3]", 2, "expected a number after '[', found '-'", false},
		{"hostlist", "n[1,]", 4, "expected a number after ',', found ']'", false},
		{"hostlist", "n[,1]", 2, "expected a number after '[', found ','", false},
		{"hostlist", "n[a-b]", 2, "expected a number after '[', found 'a'", false},
		{"hostlist", "n[1-2-3]", 5, "expected ',' or ']' after a number, found '-'", false},
		{"hostlist", "n[1 -3]", 3, "whitespace", false},
		{"hostlist", "a b", 1, "whitespace", false},
		{"hostlist", "a\x00b", 1, "control character", false},
		{"hostlist", "n[1234567890123456789]", 2, "too long", false},
		{"hostlist", "n[0-99999999]", 1, "more than 1048576 names", true},
		{"hostlist", "n[0-1048575],x", 13, "more than 1048576 names", true}, // budget is per expression
		{"hostlist", "a[0-1023]b[0-1024]", 10, "more than 1048576 names", true},
		{"hostlist", "a[0-999999999999999999]b[0-999999999999999999]", 1, "more than", true},
		{"tasks-per-node", "", 0, "empty value", false},
		{"tasks-per-node", "2,", 2, "expected a task count, found the end", false},
		{"tasks-per-node", ",2", 0, "expected a task count, found ','", false},
		{"tasks-per-node", "x", 0, "expected a task count, found 'x'", false},
		{"tasks-per-node", "-1", 0, "expected a task count, found '-'", false},
		{"tasks-per-node", "2(3)", 2, "expected 'x' after '('", false},
		{"tasks-per-node", "2(x)", 3, "expected a repeat count after '(x', found ')'", false},
		{"tasks-per-node", "2(x3", 4, "expected ')'", false},
		{"tasks-per-node", "2(x0)", 3, "repeat count must be at least 1", false},
		{"tasks-per-node", "2 (x3)", 1, "expected ',' or '(x'", false},
		{"tasks-per-node", "2(x3)1", 5, "expected ',' or '(x'", false},
		{"tasks-per-node", "2097152", 0, "larger than", false},
		{"tasks-per-node", "1(x1048576),1", 12, "more than 1048576 nodes", true},
		{"tasks-per-node", "1(x999999999999999999)", 0, "more than", true},
		{"tasks-per-node", "1(x9999999999999999999)", 3, "too long", false},
	} {
		t.Run(tc.what+"/"+tc.in, func(t *testing.T) {
			got, err := parsers[tc.what](tc.in)
			if err == nil {
				t.Fatalf("%s %q = %v, want an error", tc.what, tc.in, got)
			}
			var he *Error
			if !errors.As(err, &he) {
				t.Fatalf("%s %q: error %T %v, want *Error", tc.what, tc.in, err, err)
			}
			if he.Expr != tc.in || he.What != tc.what || he.Pos != tc.pos || !strings.Contains(he.Msg, tc.msg) {
				t.Errorf("%s %q = %+v, want pos %d and message containing %q", tc.what, tc.in, he, tc.pos, tc.msg)
			}
			if errors.Is(err, ErrTooLarge) != tc.tooMany {
				t.Errorf("errors.Is(%v, ErrTooLarge) = %v, want %v", err, !tc.tooMany, tc.tooMany)
			}
			if !strings.Contains(err.Error(), strconv.Quote(tc.in)) {
				t.Errorf("error %q does not name the input", err)
			}
		})
	}
}

// TestExpandAtCap checks that exactly MaxNames names are allowed: the cap
// rejects absurd input, not the largest legitimate one. It counts through
// parseElement instead of expanding, so the test allocates nothing big.
func TestExpandAtCap(t *testing.T) {
	for _, tc := range []struct {
		expr   string
		budget int
		ok     bool
	}{
		{"n[1-1048576]", MaxNames, true},
		{"n[1-1048576]", MaxNames - 1, false},
		{"a[1-1024]b[1-1024]", MaxNames, true},
		{"a[1-1024]b[1-1025]", MaxNames, false},
		{"plain", 1, true},
		{"plain", 0, false},
	} {
		parts, n, err := parseElement(tc.expr, 0, len(tc.expr), tc.budget, failer("hostlist", tc.expr))
		if ok := err == nil; ok != tc.ok {
			t.Errorf("parseElement(%q, budget %d) = %d names, %v; want ok=%v", tc.expr, tc.budget, n, err, tc.ok)
		}
		if err == nil && (n > tc.budget || len(parts) == 0) {
			t.Errorf("parseElement(%q) = %d names over budget %d", tc.expr, n, tc.budget)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	_, err := Expand("n[5-3]")
	want := `hostlist "n[5-3]": offset 4: range 5-3 goes backwards, expected lo <= hi`
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

// TestExpandMatchesScontrol compares Expand against SLURM itself where it is
// installed: scontrol is the reference for what SLURM_JOB_NODELIST means.
func TestExpandMatchesScontrol(t *testing.T) {
	scontrol, err := exec.LookPath("scontrol")
	if err != nil {
		t.Skip("scontrol not on PATH (Debian package slurm-client); the table above still pins SLURM's behaviour")
	}
	env := scontrolEnv(t)
	for _, tc := range expandCases {
		if !tc.slurm {
			continue
		}
		cmd := exec.Command(scontrol, "show", "hostnames", tc.expr)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("scontrol show hostnames %q: %v", tc.expr, err)
		}
		want := strings.Fields(string(out))
		got, err := Expand(tc.expr)
		if err != nil {
			t.Errorf("Expand(%q): %v; scontrol gives %q", tc.expr, err, want)
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("Expand(%q) = %q, scontrol gives %q", tc.expr, got, want)
		}
	}
}

// scontrolEnv returns the environment for scontrol: "show hostnames" needs
// no controller, but scontrol refuses to run without a configuration (and
// then tries DNS SRV records), so give it a minimal one when the
// environment has none. nil means the inherited environment.
func scontrolEnv(t *testing.T) []string {
	if os.Getenv("SLURM_CONF") != "" {
		return nil
	}
	conf := filepath.Join(t.TempDir(), "slurm.conf")
	if err := os.WriteFile(conf, []byte("ClusterName=oracle\nSlurmctldHost=localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(), "SLURM_CONF="+conf)
}

// TestExpandMatchesScontrolRandom compares Expand with scontrol on random
// expressions in the syntax SLURM accepts (a fixed seed, so failures
// reproduce): several bracket groups, padded and unpadded ranges, lists.
func TestExpandMatchesScontrolRandom(t *testing.T) {
	scontrol, err := exec.LookPath("scontrol")
	if err != nil {
		t.Skip("scontrol not on PATH (Debian package slurm-client)")
	}
	env := scontrolEnv(t)
	rng := rand.New(rand.NewPCG(1, 2))
	num := func() string {
		v := rng.IntN(12)
		if rng.IntN(3) == 0 {
			return fmt.Sprintf("%02d", v)
		}
		return strconv.Itoa(v)
	}
	for range 40 {
		var elems []string
		for range 1 + rng.IntN(3) {
			var b strings.Builder
			b.WriteString(string(rune('a' + rng.IntN(4))))
			for g := range rng.IntN(4) {
				if g > 0 {
					b.WriteString(string(rune('p' + rng.IntN(4))))
				}
				b.WriteByte('[')
				for it := range 1 + rng.IntN(3) {
					if it > 0 {
						b.WriteByte(',')
					}
					lo := num()
					b.WriteString(lo)
					if rng.IntN(2) == 0 {
						loV, _ := strconv.Atoi(lo)
						b.WriteString("-" + strconv.Itoa(loV+rng.IntN(3)))
					}
				}
				b.WriteByte(']')
			}
			elems = append(elems, b.String())
		}
		expr := strings.Join(elems, ",")
		cmd := exec.Command(scontrol, "show", "hostnames", expr)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("scontrol show hostnames %q: %v", expr, err)
		}
		want := strings.Fields(string(out))
		got, err := Expand(expr)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Expand(%q) = %q, %v; scontrol gives %q", expr, got, err, want)
		}
	}
}

func TestParseTasksPerNode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"1", []int{1}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"4,2,1(x2)", []int{4, 2, 1, 1}},
		{"16(x1)", []int{16}},
		{"0,3", []int{0, 3}}, // kept so the list stays aligned with the nodes
		{"1(x2),2(x2)", []int{1, 1, 2, 2}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTasksPerNode(tc.in)
			if err != nil {
				t.Fatalf("ParseTasksPerNode(%q): %v", tc.in, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ParseTasksPerNode(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// FuzzExpand checks that no input panics and that every success respects
// the cap; run with go test -fuzz=FuzzExpand ./hostlist.
func FuzzExpand(f *testing.F) {
	for _, tc := range expandCases {
		f.Add(tc.expr)
	}
	f.Add("n[1-3")
	f.Add("a[0-1023]b[0-1024]")
	f.Fuzz(func(t *testing.T, expr string) {
		names, err := Expand(expr)
		if err == nil && (len(names) == 0 || len(names) > MaxNames) {
			t.Errorf("Expand(%q) gave %d names", expr, len(names))
		}
		var he *Error
		if err != nil && !errors.As(err, &he) {
			t.Errorf("Expand(%q) error %T is not *Error", expr, err)
		}
	})
}

func FuzzParseTasksPerNode(f *testing.F) {
	f.Add("2(x3),1")
	f.Add("4,2,1(x2)")
	f.Fuzz(func(t *testing.T, s string) {
		counts, err := ParseTasksPerNode(s)
		if err == nil && (len(counts) == 0 || len(counts) > MaxNames) {
			t.Errorf("ParseTasksPerNode(%q) gave %d counts", s, len(counts))
		}
	})
}

func TestZipTasks(t *testing.T) {
	for _, tc := range []struct {
		nodes, tasks string
		want         []NodeTasks
		err          error // nil, ErrMismatch, or a *Error (any)
	}{
		{"n[1-4]", "4,2,1(x2)", []NodeTasks{{"n1", 4}, {"n2", 2}, {"n3", 1}, {"n4", 1}}, nil},
		{"vm", "4", []NodeTasks{{"vm", 4}}, nil},
		{"b,a", "1,2", []NodeTasks{{"b", 1}, {"a", 2}}, nil},
		{"n[1-3]", "2(x2)", nil, ErrMismatch},
		{"n[1-2]", "1(x3)", nil, ErrMismatch},
		{"n[1-", "1", nil, &Error{}},
		{"n1", "x", nil, &Error{}},
	} {
		t.Run(tc.nodes+"/"+tc.tasks, func(t *testing.T) {
			got, err := ZipTasks(tc.nodes, tc.tasks)
			switch want := tc.err.(type) {
			case nil:
				if err != nil || !slices.Equal(got, tc.want) {
					t.Errorf("ZipTasks = %v, %v; want %v", got, err, tc.want)
				}
			case *Error:
				if !errors.As(err, &want) {
					t.Errorf("ZipTasks error %v, want a *Error", err)
				}
			default:
				if !errors.Is(err, tc.err) {
					t.Errorf("ZipTasks error %v, want %v", err, tc.err)
				}
			}
		})
	}
}
