package cliflag

import (
	"bytes"
	"errors"
	"flag"
	"testing"
)

// A bad command line comes back as one error and nothing is printed;
// -h prints the usage and returns flag.ErrHelp.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // the error; "" for none
	}{
		{[]string{"-np", "2"}, ""},
		{[]string{"--npp", "2"}, "unknown flag -npp (did you mean -np?)"},
		{[]string{"--time=1s"}, "unknown flag -time (did you mean -timeout?)"},
		{[]string{"--zzzzzz"}, "unknown flag -zzzzzz"},
		{[]string{"-np", "four"}, `invalid value "four" for flag -np: parse error`},
	} {
		var out bytes.Buffer
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(&out)
		fs.Int("np", 0, "")
		fs.Duration("timeout", 0, "")
		fs.Bool("tag-output", false, "")
		err := Parse(fs, c.args)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want || out.Len() != 0 {
			t.Errorf("Parse(%q) = %q, printed %q; want %q and nothing printed", c.args, got, out.String(), c.want)
		}
	}
	var out bytes.Buffer
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Usage = func() { out.WriteString("usage text") }
	if err := Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) || out.String() != "usage text" {
		t.Errorf("-h: %v, printed %q", err, out.String())
	}
}
