package hostfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/hostlist"
)

// Host lists come from two places, both in Open MPI's spelling plus SLURM
// hostlist expressions (see hostfile.example at the repository root):
//
//   - a hostfile, one host (or hostlist expression) per line:
//     "node[01-04] slots=4 max_slots=8   # comment"
//   - the -H value, comma-separated: "a:2,b,node[01-04]:4"
//
// Slots default to 1 when not given. That is mpirun's rule for -H; for
// hostfiles Open MPI instead counts the host's processor cores, which it
// learns by starting its daemon there. gorun uses 1 in both places because a
// plan is a pure function of its input, made before any remote host is
// contacted, and because GPU jobs size themselves with --gpus-per-host and
// slots=N rather than core counts. A hostfile that cares writes slots=N.

// maxSlotsValue bounds one slots= or max_slots= value. No host runs a
// million ranks; a larger number is a typo, and the bound keeps sums of
// duplicates far from integer overflow.
const maxSlotsValue = 1 << 20

// maxLineBytes bounds one hostfile line, so a binary file given by mistake
// fails with a line number instead of exhausting memory.
const maxLineBytes = 1 << 20

// HostListSource is the ParseError.File of errors from ParseList.
const HostListSource = "-H"

// ParseError reports a malformed hostfile or -H value: where, what was
// expected and what was found. Its message reads like a compiler's:
// "hosts:3: slots must be a positive integer, got "x"".
type ParseError struct {
	// File is the hostfile name as given, or HostListSource for -H.
	File string
	// Line is the 1-based line number; 0 when the error concerns the whole
	// input (an empty hostfile) or the input has no lines (-H).
	Line int
	// Msg says what was expected and what was found.
	Msg string
	// Err is the underlying error, such as a *hostlist.Error, or nil.
	Err error
}

func (e *ParseError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Unwrap returns the underlying error, if any.
func (e *ParseError) Unwrap() error { return e.Err }

// Parse reads an Open MPI style hostfile; see ParseReader.
// A file that cannot be opened returns the *os.PathError, which names it.
func Parse(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("launcher: hostfile: %w", err)
	}
	defer f.Close()
	return ParseReader(path, f)
}

// ParseReader parses a hostfile read from r; name is used in error
// messages. The syntax, one host per line:
//
//	name [slots=N] [max_slots=M]    # trailing comment
//
// name is a host name or a SLURM hostlist expression ("node[01-04]"); every
// name it expands to gets the line's slots. Whitespace around '=' is
// allowed, as in Open MPI. Accepted keys are Open MPI's: slots (aliases count
// and cpu) and max_slots (aliases max-slots, slots_max, slots-max). Open
// MPI's bare "slots N" is not valid there either and is rejected with a
// hint. Other Open MPI keys (username, port, boards, ...) and unknown keys
// are errors, never silently ignored.
//
// Slots default to 1, or to max_slots when only max_slots is given (Open
// MPI's rule: "max_slots=8" alone means the host takes 8). max_slots, when
// given, must be at least slots; 0 in the result means no cap.
//
// A name seen again adds its slots to the first occurrence, which keeps its
// position (rank order); max_slots add up too, and an uncapped occurrence
// makes the host uncapped. Open MPI moves a repeated host to its last
// position instead; keeping the first is what users expect from the file's
// order.
//
// '#' starts a comment anywhere on a line; blank lines are skipped; CRLF line
// ends are accepted. A file with no hosts is an error naming the file.
// Every syntax error is a *ParseError with the line number.
func ParseReader(name string, r io.Reader) ([]Host, error) {
	return parse(name, r, hostlist.MaxNames)
}

// parse is ParseReader with the cap on the total number of
// names as a parameter, so tests can reach it without a million names.
func parse(name string, r io.Reader, maxNames int) ([]Host, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	m := hostMerger{maxNames: maxNames}
	line := 0
	for sc.Scan() {
		line++
		if err := parseHostfileLine(&m, sc.Text()); err != nil {
			err.File, err.Line = name, line
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ParseError{File: name, Line: line + 1, Msg: fmt.Sprintf("line longer than %d bytes; is this a hostfile?", maxLineBytes), Err: err}
		}
		return nil, &ParseError{File: name, Line: line, Msg: fmt.Sprintf("read failed: %v", err), Err: err}
	}
	if len(m.hosts) == 0 {
		return nil, &ParseError{File: name, Msg: "no hosts: the hostfile is empty or holds only comments and blank lines"}
	}
	return m.hosts, nil
}

// slotKeys and maxSlotKeys are the spellings Open MPI's hostfile lexer
// accepts for the two attributes gorun supports.
var (
	slotKeys    = map[string]bool{"slots": true, "count": true, "cpu": true}
	maxSlotKeys = map[string]bool{"max_slots": true, "max-slots": true, "slots_max": true, "slots-max": true}
	// ompiOnlyKeys are valid in Open MPI hostfiles but mean nothing to
	// gorun; they get their own message so users know the file is not
	// simply misspelled.
	ompiOnlyKeys = map[string]bool{
		"username": true, "user_name": true, "user-name": true, "port": true,
		"boards": true, "sockets": true, "sockets_per_board": true, "sockets-per-board": true,
		"cores": true, "cores_per_socket": true, "cores-per-socket": true,
	}
)

// parseHostfileLine parses one line into m. The returned error lacks File
// and Line, which the caller knows.
func parseHostfileLine(m *hostMerger, text string) *ParseError {
	if i := strings.IndexByte(text, '#'); i >= 0 {
		text = text[:i]
	}
	text = strings.TrimRight(text, "\r")
	s := text
	skipSpace := func() { s = strings.TrimLeft(s, " \t\f\v\r") }
	skipSpace()
	if s == "" {
		return nil
	}

	// The name runs to the first whitespace.
	end := strings.IndexAny(s, " \t\f\v\r")
	if end < 0 {
		end = len(s)
	}
	expr := s[:end]
	s = s[end:]
	if strings.Contains(expr, "=") {
		return &ParseError{Msg: fmt.Sprintf("expected a host name at the start of the line, found %q", expr)}
	}

	slots, maxSlots := 0, 0
	seen := map[string]string{} // attribute → spelling used, to reject repeats
	for {
		skipSpace()
		if s == "" {
			break
		}
		// key: up to whitespace or '='.
		k := strings.IndexAny(s, "= \t\f\v\r")
		if k < 0 {
			k = len(s)
		}
		key := s[:k]
		s = s[k:]
		skipSpace()
		attr := ""
		switch {
		case slotKeys[key]:
			attr = "slots"
		case maxSlotKeys[key]:
			attr = "max_slots"
		}
		if !strings.HasPrefix(s, "=") {
			if attr != "" {
				return &ParseError{Msg: fmt.Sprintf("expected '=' after %s, as in %s=4", key, attr)}
			}
			if key == "" { // cannot happen: s is non-empty and starts with a non-space
				return &ParseError{Msg: "expected key=value after the host name"}
			}
			return &ParseError{Msg: fmt.Sprintf("unexpected %q after host %q; expected key=value such as slots=4 (one host per line)", key, expr)}
		}
		s = s[1:]
		skipSpace()
		if key == "" {
			return &ParseError{Msg: "expected a key before '=', such as slots=4"}
		}
		v := strings.IndexAny(s, " \t\f\v\r")
		if v < 0 {
			v = len(s)
		}
		val := s[:v]
		s = s[v:]
		switch {
		case attr == "" && ompiOnlyKeys[key]:
			return &ParseError{Msg: fmt.Sprintf("Open MPI hostfile key %q is not supported by gorun; supported keys are slots and max_slots", key)}
		case attr == "":
			return &ParseError{Msg: fmt.Sprintf("unknown key %q; expected slots or max_slots", key)}
		}
		if prev, dup := seen[attr]; dup {
			return &ParseError{Msg: fmt.Sprintf("%s given twice on one line (as %s and %s)", attr, prev, key)}
		}
		seen[attr] = key
		n, perr := parseSlotCount(key, val, key+"=")
		if perr != nil {
			return perr
		}
		if attr == "slots" {
			slots = n
		} else {
			maxSlots = n
		}
	}

	switch {
	case slots == 0 && maxSlots == 0:
		slots = 1
	case slots == 0:
		slots = maxSlots
	case maxSlots != 0 && maxSlots < slots:
		return &ParseError{Msg: fmt.Sprintf("max_slots must be at least slots, got max_slots=%d below slots=%d", maxSlots, slots)}
	}
	return m.addExpr(expr, slots, maxSlots)
}

// parseSlotCount parses a slots or max_slots value; after is what precedes
// it ("slots=" or "':'"), for the message when it is missing.
func parseSlotCount(key, val, after string) (int, *ParseError) {
	if val == "" {
		return 0, &ParseError{Msg: fmt.Sprintf("expected a number after %s", after)}
	}
	n, err := strconv.Atoi(val)
	if err != nil || n < 1 {
		if err != nil && errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(val, "-") {
			return 0, &ParseError{Msg: fmt.Sprintf("%s is too large, got %s (limit %d)", key, val, maxSlotsValue)}
		}
		return 0, &ParseError{Msg: fmt.Sprintf("%s must be a positive integer, got %q", key, val)}
	}
	if n > maxSlotsValue {
		return 0, &ParseError{Msg: fmt.Sprintf("%s is too large, got %d (limit %d)", key, n, maxSlotsValue)}
	}
	return n, nil
}

// ParseList parses mpirun's -H value: comma-separated elements, each a
// host name or hostlist expression with an optional ":slots" suffix, e.g.
// "a:2,b,node[01-04]:4". Commas inside brackets belong to the expression.
// Every name an element expands to gets its slots (default 1, mpirun's rule);
// repeated names add up and keep their first position, so "-H a,a" gives a
// two slots, as with mpirun. There is no max_slots in -H.
//
// An element that is an IPv6 address as a whole ("::1") is a name without
// slots; give an IPv6 host slots in a hostfile, where ':' is unambiguous.
// Every error is a *ParseError with File HostListSource.
func ParseList(spec string) ([]Host, error) {
	fail := func(format string, args ...any) error {
		return &ParseError{File: HostListSource, Msg: fmt.Sprintf(format, args...)}
	}
	if strings.TrimSpace(spec) == "" {
		return nil, fail("empty host list, expected host[:slots],...")
	}
	m := hostMerger{maxNames: hostlist.MaxNames}
	start, depth, elem := 0, 0, 0
	for i := 0; i <= len(spec); i++ {
		if i < len(spec) {
			switch spec[i] {
			case '[':
				depth++
				continue
			case ']':
				depth--
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		// spec[start:i] is one element; bracket errors inside it are left
		// to hostlist, which reports them with an offset.
		elem++
		el := spec[start:i]
		if el == "" {
			return nil, fail("element %d is empty, expected host[:slots]", elem)
		}
		name, slots := el, 1
		if _, err := netip.ParseAddr(el); err != nil {
			if c := strings.LastIndexByte(el, ':'); c >= 0 && c > strings.LastIndexByte(el, ']') {
				name = el[:c]
				n, perr := parseSlotCount("slots", el[c+1:], "':'")
				if perr != nil {
					return nil, fail("element %d (%q): %s", elem, el, perr.Msg)
				}
				slots = n
			}
		}
		if perr := m.addExpr(name, slots, 0); perr != nil {
			perr.File = HostListSource
			perr.Msg = fmt.Sprintf("element %d (%q): %s", elem, el, perr.Msg)
			return nil, perr
		}
		start = i + 1
	}
	return m.hosts, nil
}

// hostMerger accumulates hosts in first-seen order, merging repeats.
type hostMerger struct {
	hosts []Host
	index map[string]int
	// names counts the names expanded so far; more than maxNames in all is
	// an error, as a single hostlist expression's expansion is.
	names, maxNames int
}

// addExpr expands expr and adds each name with the given slots.
func (m *hostMerger) addExpr(expr string, slots, maxSlots int) *ParseError {
	names, err := hostlist.Expand(expr)
	if err != nil {
		return &ParseError{Msg: err.Error(), Err: err}
	}
	m.names += len(names)
	if m.names > m.maxNames {
		return &ParseError{Msg: fmt.Sprintf("more than %d host names in total", m.maxNames), Err: hostlist.ErrTooLarge}
	}
	if m.index == nil {
		m.index = map[string]int{}
	}
	for _, name := range names {
		if msg := checkHostName(name); msg != "" {
			if name != expr {
				msg = fmt.Sprintf("%s (expanded from %q)", msg, expr)
			}
			return &ParseError{Msg: msg}
		}
		i, ok := m.index[name]
		if !ok {
			m.index[name] = len(m.hosts)
			m.hosts = append(m.hosts, Host{Name: name, Slots: slots, MaxSlots: maxSlots})
			continue
		}
		h := &m.hosts[i]
		if h.Slots > math.MaxInt-slots {
			return &ParseError{Msg: fmt.Sprintf("host %q: slots add up beyond %d", name, math.MaxInt)}
		}
		h.Slots += slots
		if h.MaxSlots == 0 || maxSlots == 0 {
			h.MaxSlots = 0 // one uncapped occurrence uncaps the host
		} else {
			h.MaxSlots += maxSlots // cannot overflow: at most Slots' bound
		}
	}
	return nil
}

// checkHostName returns why name cannot be a host name, or "". Names are
// passed to ssh and srun, so anything that could be read as an option or
// as shell syntax is refused here, with the reason, rather than failing
// obscurely on a remote host.
func checkHostName(name string) string {
	switch {
	case name == "":
		return "empty host name"
	case name[0] == '-':
		return fmt.Sprintf("host name %q must not start with '-'", name)
	case name[0] == '^':
		return fmt.Sprintf("host name %q: Open MPI's ^host exclusion is not supported", name)
	case strings.ContainsRune(name, '@'):
		return fmt.Sprintf("host name %q: user@host is not supported; set the user in ~/.ssh/config", name)
	}
	if strings.ContainsRune(name, ':') {
		if _, err := netip.ParseAddr(name); err == nil {
			return "" // IPv6 literal
		}
		return fmt.Sprintf("%q is not a host name: ':' only appears in IPv6 addresses (in a hostfile, write slots=N)", name)
	}
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			continue
		}
		return fmt.Sprintf("host name %q contains %q; expected letters, digits, '-', '.' or '_'", name, r)
	}
	return ""
}
