// Package cliflag owns how gorun's commands and subcommands report a bad
// command line: in one line that names the flag, and the closest defined
// flag when it was mistyped, never with Go's whole flag usage. Printing the
// line and choosing the exit code stay with the caller (cmd/gorun).
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Parse parses args with fs and prints nothing when they are wrong: the
// error is returned, an unknown flag rewritten as "unknown flag -x (did you
// mean -y?)". -h and --help print fs.Usage to fs's output and return
// flag.ErrHelp.
func Parse(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	msg := "unknown flag -" + name
	if best := Closest(fs, name); best != "" {
		msg += " (did you mean -" + best + "?)"
	}
	return errors.New(msg)
}

// Closest returns the defined flag nearest to name in edit distance, or ""
// when none is near enough to be a likely typo (more than a third of the
// name would have to change). A flag that name abbreviates counts as near:
// --time for --timeout. Ties go to the shorter name (VisitAll is in name
// order, so the result is deterministic).
func Closest(fs *flag.FlagSet, name string) string {
	name = strings.TrimLeft(name, "-")
	if i := strings.IndexByte(name, '='); i >= 0 {
		name = name[:i]
	}
	best, bestDist := "", len(name)/3+1
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if len(name) >= 3 && strings.HasPrefix(f.Name, name) {
			d = min(d, 1)
		}
		if d < bestDist || d == bestDist && best != "" && len(f.Name) < len(best) {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// OneOf returns s as a T when it is one of allowed, and otherwise an error
// that quotes it after what (a flag or setting, with its package's prefix)
// and lists every allowed word: `what "s": expected a, b or c`. The list
// in the message is the list it accepts, so the two cannot drift apart.
func OneOf[T ~string](what, s string, allowed ...T) (T, error) {
	for _, a := range allowed {
		if string(a) == s {
			return a, nil
		}
	}
	words := make([]string, len(allowed))
	for i, a := range allowed {
		words[i] = string(a)
	}
	list := strings.Join(words, ", ")
	if n := len(words); n > 1 {
		list = strings.Join(words[:n-1], ", ") + " or " + words[n-1]
	}
	return "", fmt.Errorf("%s %q: expected %s", what, s, list)
}
