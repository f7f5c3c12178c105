package hostfile

import (
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/hostlist"
)

func TestParseHostfileReader(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Host
	}{
		{"one host", "a\n", []Host{{"a", 1, 0}}},
		{"no final newline", "a slots=2", []Host{{"a", 2, 0}}},
		{"slots and max", "a slots=2 max_slots=4\n", []Host{{"a", 2, 4}}},
		{"spaces around =", "a slots = 2\tmax_slots= 3\n", []Host{{"a", 2, 3}}},
		{"max only means slots=max (Open MPI)", "a max_slots=8\n", []Host{{"a", 8, 8}}},
		{"aliases", "a count=2\nb cpu=3 slots-max=5\nc max-slots=1\nd slots_max=2 slots=1\n",
			[]Host{{"a", 2, 0}, {"b", 3, 5}, {"c", 1, 1}, {"d", 1, 2}}},
		{"comments and blanks", "# header\n\n  a   # trailing\n\t\nb slots=2#tight\n",
			[]Host{{"a", 1, 0}, {"b", 2, 0}}},
		{"leading whitespace", "   a slots=2\n", []Host{{"a", 2, 0}}},
		{"crlf", "a slots=2\r\nb\r\n", []Host{{"a", 2, 0}, {"b", 1, 0}}},
		{"hostlist", "n[08-10] slots=2\n",
			[]Host{{"n08", 2, 0}, {"n09", 2, 0}, {"n10", 2, 0}}},
		{"hostlist with commas", "vm,n[1,3] slots=2\n",
			[]Host{{"vm", 2, 0}, {"n1", 2, 0}, {"n3", 2, 0}}},
		{"order kept, not sorted", "z\na\nm\n", []Host{{"z", 1, 0}, {"a", 1, 0}, {"m", 1, 0}}},
		{"duplicates add, first position kept", "a slots=2\nb\na slots=3\n",
			[]Host{{"a", 5, 0}, {"b", 1, 0}}},
		{"duplicate max add", "a slots=1 max_slots=2\na slots=2 max_slots=3\n", []Host{{"a", 3, 5}}},
		{"uncapped duplicate uncaps", "a slots=1 max_slots=2\na slots=2\n", []Host{{"a", 3, 0}}},
		{"duplicate inside an expression", "n[1,1]\n", []Host{{"n1", 2, 0}}},
		{"expression then single", "n[1-2]\nn1 slots=3\n", []Host{{"n1", 4, 0}, {"n2", 1, 0}}},
		{"dotted and underscored", "node-1.example.org\nmy_host\n10.0.0.1\n",
			[]Host{{"node-1.example.org", 1, 0}, {"my_host", 1, 0}, {"10.0.0.1", 1, 0}}},
		{"ipv6 literal", "::1 slots=2\nfe80::1%eth0\n", []Host{{"::1", 2, 0}, {"fe80::1%eth0", 1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseReader("hosts", strings.NewReader(tc.in))
			if err != nil {
				t.Fatalf("parse %q: %v", tc.in, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("parse %q = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseHostfileReaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     string // the whole message
	}{
		{"empty", "", `hosts: no hosts: the hostfile is empty or holds only comments and blank lines`},
		{"only comments", "# a\n\n", `hosts: no hosts: the hostfile is empty or holds only comments and blank lines`},
		{"bad slots", "a\nb\nc slots=x\n", `hosts:3: slots must be a positive integer, got "x"`},
		{"zero slots", "a slots=0\n", `hosts:1: slots must be a positive integer, got "0"`},
		{"negative slots", "a slots=-2\n", `hosts:1: slots must be a positive integer, got "-2"`},
		{"huge slots", "a slots=99999999999999999999\n", `hosts:1: slots is too large, got 99999999999999999999 (limit 1048576)`},
		{"large slots", "a slots=2000000\n", `hosts:1: slots is too large, got 2000000 (limit 1048576)`},
		{"missing value", "a slots=\n", `hosts:1: expected a number after slots=`},
		{"missing value before next", "a slots= max_slots=2\n", `hosts:1: slots must be a positive integer, got "max_slots=2"`},
		{"max below slots", "a slots=4 max_slots=2\n", `hosts:1: max_slots must be at least slots, got max_slots=2 below slots=4`},
		{"bare slots N", "a slots 4\n", `hosts:1: expected '=' after slots, as in slots=4`},
		{"bare max_slots", "a max-slots\n", `hosts:1: expected '=' after max-slots, as in max_slots=4`},
		{"two hosts on a line", "a b\n", `hosts:1: unexpected "b" after host "a"; expected key=value such as slots=4 (one host per line)`},
		{"unknown key", "a slot=2\n", `hosts:1: unknown key "slot"; expected slots or max_slots`},
		{"open mpi only key", "a username=bob\n", `hosts:1: Open MPI hostfile key "username" is not supported by gorun; supported keys are slots and max_slots`},
		{"no key", "a =2\n", `hosts:1: expected a key before '=', such as slots=4`},
		{"repeated key", "a slots=1 count=2\n", `hosts:1: slots given twice on one line (as slots and count)`},
		{"line starts with key", "slots=2\n", `hosts:1: expected a host name at the start of the line, found "slots=2"`},
		{"bad hostlist", "ok\nn[1-3 slots=2\n", `hosts:2: hostlist "n[1-3": offset 1: '[' is never closed, expected ']'`},
		{"backwards range", "n[5-3]\n", `hosts:1: hostlist "n[5-3]": offset 4: range 5-3 goes backwards, expected lo <= hi`},
		{"colon slots", "a:4\n", `hosts:1: "a:4" is not a host name: ':' only appears in IPv6 addresses (in a hostfile, write slots=N)`},
		{"user at host", "bob@a\n", `hosts:1: host name "bob@a": user@host is not supported; set the user in ~/.ssh/config`},
		{"exclusion", "^a\n", `hosts:1: host name "^a": Open MPI's ^host exclusion is not supported`},
		{"option-like name", "-oProxyCommand=x\n", `hosts:1: expected a host name at the start of the line, found "-oProxyCommand=x"`},
		{"dash name", "-a\n", `hosts:1: host name "-a" must not start with '-'`},
		{"bad character", "a;b\n", `hosts:1: host name "a;b" contains ';'; expected letters, digits, '-', '.' or '_'`},
		{"bad character after expansion", "a$[1-2]\n", `hosts:1: host name "a$1" contains '$'; expected letters, digits, '-', '.' or '_' (expanded from "a$[1-2]")`},
		{"long line", strings.Repeat("a", maxLineBytes+1), `hosts:1: line longer than 1048576 bytes; is this a hostfile?`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseReader("hosts", strings.NewReader(tc.in))
			if err == nil {
				t.Fatalf("parse %q = %v, want error %s", tc.in, got, tc.want)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v, want *ParseError", err, err)
			}
			if err.Error() != tc.want {
				t.Errorf("parse %q:\n got  %s\n want %s", tc.in, err, tc.want)
			}
		})
	}
}

// TestHostfileNameCap checks the cap on the total number of names across
// lines, with a small cap so the test allocates little.
func TestHostfileNameCap(t *testing.T) {
	in := "n[1-3]\nm[1-2]\nx\n"
	if _, err := parse("hosts", strings.NewReader(in), 6); err != nil {
		t.Errorf("6 names under a cap of 6: %v", err)
	}
	_, err := parse("hosts", strings.NewReader(in), 5)
	if want := "hosts:3: more than 5 host names in total"; err == nil || err.Error() != want || !errors.Is(err, hostlist.ErrTooLarge) {
		t.Errorf("6 names under a cap of 5: got %v, want %s wrapping hostlist.ErrTooLarge", err, want)
	}
}

// TestParseErrorUnwrap checks that the cause stays reachable, so callers can
// tell an oversized hostlist from a typo.
func TestParseErrorUnwrap(t *testing.T) {
	_, err := ParseReader("hosts", strings.NewReader("n[0-99999999]\n"))
	if !errors.Is(err, hostlist.ErrTooLarge) {
		t.Errorf("error %v does not wrap hostlist.ErrTooLarge", err)
	}
	var he *hostlist.Error
	if !errors.As(err, &he) || he.Expr != "n[0-99999999]" {
		t.Errorf("error %v does not carry the *hostlist.Error", err)
	}
}

func TestParseHostfileFixtures(t *testing.T) {
	for _, tc := range []struct {
		file    string
		want    []Host
		wantErr string
	}{
		{file: "hostfile_basic", want: []Host{
			{"head", 2, 0}, {"gpu01", 4, 8}, {"gpu02", 4, 8}, {"gpu03", 4, 8}, {"spare", 1, 0}}},
		{file: "hostfile_openmpi", want: []Host{
			{"a", 3, 0}, {"b", 3, 0}, {"c", 1, 4}, {"d", 6, 6}, {"e", 1, 2}}},
		{file: "hostfile_crlf", want: []Host{{"h1", 2, 0}, {"h2", 1, 0}}},
		{file: "hostfile_empty", wantErr: "testdata/hostfile_empty: no hosts"},
		{file: "hostfile_bad_slots", wantErr: `testdata/hostfile_bad_slots:3: slots must be a positive integer, got "x"`},
		{file: "hostfile_bad_bracket", wantErr: `testdata/hostfile_bad_bracket:1: hostlist "node[01-04": offset 4: '[' is never closed`},
		{file: "hostfile_missing", wantErr: "launcher: hostfile: open testdata/hostfile_missing: no such file or directory"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := Parse(filepath.Join("testdata", tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want error starting %s", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	_, err := Parse(filepath.Join("testdata", "hostfile_missing"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing hostfile: %v does not wrap fs.ErrNotExist", err)
	}
}

// TestHostfileExample keeps the documented example valid.
func TestHostfileExample(t *testing.T) {
	hosts, err := Parse(filepath.Join("..", "..", "hostfile.example"))
	if err != nil {
		t.Fatalf("hostfile.example does not parse: %v", err)
	}
	if len(hosts) == 0 {
		t.Fatal("hostfile.example has no hosts")
	}
}

func TestParseHostList(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []Host
	}{
		{"localhost", []Host{{"localhost", 1, 0}}},
		{"a:2,b,node[01-02]:4", []Host{{"a", 2, 0}, {"b", 1, 0}, {"node01", 4, 0}, {"node02", 4, 0}}},
		{"n[1,3-4]:2", []Host{{"n1", 2, 0}, {"n3", 2, 0}, {"n4", 2, 0}}},
		{"a,a", []Host{{"a", 2, 0}}}, // mpirun: repeated host, one slot each
		{"a:2,b,a:3", []Host{{"a", 5, 0}, {"b", 1, 0}}},
		{"c,b,a", []Host{{"c", 1, 0}, {"b", 1, 0}, {"a", 1, 0}}},
		{"r[1-2]n[1-2]", []Host{{"r1n1", 1, 0}, {"r1n2", 1, 0}, {"r2n1", 1, 0}, {"r2n2", 1, 0}}},
		{"127.0.0.1:3", []Host{{"127.0.0.1", 3, 0}}},
		{"::1", []Host{{"::1", 1, 0}}},
		{"::1,localhost:2", []Host{{"::1", 1, 0}, {"localhost", 2, 0}}},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := ParseList(tc.spec)
			if err != nil {
				t.Fatalf("ParseList(%q): %v", tc.spec, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ParseList(%q) = %v, want %v", tc.spec, got, tc.want)
			}
		})
	}
}

func TestParseHostListErrors(t *testing.T) {
	for _, tc := range []struct {
		spec, want string
	}{
		{"", `-H: empty host list, expected host[:slots],...`},
		{"a,,b", `-H: element 2 is empty, expected host[:slots]`},
		{"a,", `-H: element 2 is empty, expected host[:slots]`},
		{",a", `-H: element 1 is empty, expected host[:slots]`},
		{"a:x", `-H: element 1 ("a:x"): slots must be a positive integer, got "x"`},
		{"a:0", `-H: element 1 ("a:0"): slots must be a positive integer, got "0"`},
		{"b,a:", `-H: element 2 ("a:"): expected a number after ':'`},
		{":2", `-H: element 1 (":2"): hostlist "": offset 0: empty expression, expected a host name`},
		{"n[1-3:2", `-H: element 1 ("n[1-3:2"): hostlist "n[1-3": offset 1: '[' is never closed, expected ']'`},
		{"n[3-1]:2", `-H: element 1 ("n[3-1]:2"): hostlist "n[3-1]": offset 4: range 3-1 goes backwards, expected lo <= hi`},
		{"a, b", `-H: element 2 (" b"): hostlist " b": offset 0: whitespace is not allowed, expected ',' between names`},
		{"a:2:3", `-H: element 1 ("a:2:3"): "a:2" is not a host name: ':' only appears in IPv6 addresses (in a hostfile, write slots=N)`},
		{"bob@a", `-H: element 1 ("bob@a"): host name "bob@a": user@host is not supported; set the user in ~/.ssh/config`},
		{"-oProxyCommand=x", `-H: element 1 ("-oProxyCommand=x"): host name "-oProxyCommand=x" must not start with '-'`},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := ParseList(tc.spec)
			if err == nil {
				t.Fatalf("ParseList(%q) = %v, want error", tc.spec, got)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.File != HostListSource {
				t.Fatalf("error %T %v, want *ParseError from -H", err, err)
			}
			if err.Error() != tc.want {
				t.Errorf("ParseList(%q):\n got  %s\n want %s", tc.spec, err, tc.want)
			}
		})
	}
}

// FuzzParseHostfileReader checks that no input panics and that every
// success satisfies Host's invariants.
func FuzzParseHostfileReader(f *testing.F) {
	f.Add("a slots=2 max_slots=4\nn[1-3]\n")
	f.Add("# c\nb count = 3 # x\n")
	f.Fuzz(func(t *testing.T, in string) {
		hosts, err := ParseReader("f", strings.NewReader(in))
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not *ParseError", err)
			}
			return
		}
		checkHosts(t, hosts)
	})
}

func FuzzParseHostList(f *testing.F) {
	f.Add("a:2,b,node[01-04]:4")
	f.Fuzz(func(t *testing.T, spec string) {
		hosts, err := ParseList(spec)
		if err == nil {
			checkHosts(t, hosts)
		}
	})
}

func checkHosts(t *testing.T, hosts []Host) {
	t.Helper()
	if len(hosts) == 0 {
		t.Fatal("success with no hosts")
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		if h.Name == "" || h.Slots < 1 || (h.MaxSlots != 0 && h.MaxSlots < h.Slots) || seen[h.Name] {
			t.Fatalf("bad host %+v in %v", h, hosts)
		}
		seen[h.Name] = true
	}
}
