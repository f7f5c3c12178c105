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

// OneOf accepts exactly the allowed words, as the caller's type, and
// refuses anything else listing them all; the empty string and a word of
// another case are refused too.
func TestOneOf(t *testing.T) {
	type mode string
	for _, c := range []struct {
		in      string
		allowed []mode
		want    mode
		err     string
	}{
		{"port", []mode{"fd", "port", "none"}, "port", ""},
		{"fd", []mode{"fd", "port", "none"}, "fd", ""},
		{"pmix", []mode{"fd", "port", "none"}, "", `t: --pmi "pmix": expected fd, port or none`},
		{"", []mode{"fd", "port", "none"}, "", `t: --pmi "": expected fd, port or none`},
		{"FD", []mode{"fd", "port"}, "", `t: --pmi "FD": expected fd or port`},
		{"x", []mode{"on"}, "", `t: --pmi "x": expected on`},
	} {
		got, err := OneOf("t: --pmi", c.in, c.allowed...)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if got != c.want || msg != c.err {
			t.Errorf("OneOf(%q, %q) = %q, %q; want %q, %q", c.in, c.allowed, got, msg, c.want, c.err)
		}
	}
}
