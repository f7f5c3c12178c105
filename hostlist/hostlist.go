package hostlist

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxNames caps how many names one expression (or one tasks-per-node list)
// may expand to. A million hosts is beyond any machine gorun targets, while
// "n[0-99999999]" is an easy typo that would otherwise allocate gigabytes
// before anything could report it.
const MaxNames = 1 << 20

// maxDigits bounds a number inside brackets. 18 decimal digits always fit in
// a uint64, so parsing cannot overflow and range sizes cannot wrap.
const maxDigits = 18

// ErrTooLarge is wrapped by an *Error when an expansion would exceed
// MaxNames, so callers can tell "too big" from "malformed" with errors.Is.
var ErrTooLarge = errors.New("hostlist: expansion too large")

// Error reports a malformed or oversized expression: which input, the byte
// offset where the problem was found, and what was expected there.
type Error struct {
	// What names the notation: "hostlist" or "tasks-per-node".
	What string
	// Expr is the whole input as given.
	Expr string
	// Pos is the byte offset into Expr where the problem was found.
	Pos int
	// Msg says what was expected and what was found.
	Msg string
	// Err is ErrTooLarge for oversized expansions, nil otherwise.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %q: offset %d: %s", e.What, e.Expr, e.Pos, e.Msg)
}

// Unwrap returns ErrTooLarge for oversized expansions.
func (e *Error) Unwrap() error { return e.Err }

// rng is one "lo" or "lo-hi" item inside brackets. width is the number of
// digits written for lo: SLURM pads every value of the range to it, which is
// how "n[08-11]" keeps its zero.
type rng struct {
	lo, hi uint64
	width  int
}

// part of a name: literal text, or a bracket group when ranges is non-nil.
type part struct {
	text   string
	ranges []rng
}

// Expand returns the host names an expression denotes, in SLURM's order:
// top-level comma-separated elements left to right; inside an element with
// several bracket groups, the product in the order SLURM produces it
// ("r[1-2]n[1-2]" gives r1n1 r1n2 r2n1 r2n2; with three or more groups see
// appendProduct). Duplicates are kept and nothing is sorted, because rank
// order follows this order.
//
// Inside brackets, items are numbers or lo-hi ranges separated by commas;
// every value of an item is zero-padded to the number of digits written for
// its lo ("n[08-11]" gives n08 n09 n10 n11, "n[8-11]" gives n8 n9 n10 n11).
//
// Beyond SLURM (22.05), text may follow a bracket group ("n[1-2]-ib" gives
// n1-ib n2-ib), because interface-suffixed host names are common in -H and
// hostfiles; SLURM itself never writes such a list. Stricter than SLURM:
// whitespace is not a separator (a stray space is usually a quoting
// mistake), and forms SLURM quietly accepts such as "n[1-]" (n1) or an empty
// element are errors. Every error is an *Error.
func Expand(expr string) ([]string, error) {
	fail := failer("hostlist", expr)
	if expr == "" {
		return nil, fail(0, "empty expression, expected a host name")
	}
	elems, err := splitTop(expr, fail)
	if err != nil {
		return nil, err
	}

	// Parse everything and count first, so an oversized or malformed input
	// is rejected before anything is allocated for it.
	parsed := make([][]part, len(elems))
	total := 0
	for i, el := range elems {
		parts, n, err := parseElement(expr, el.start, el.end, MaxNames-total, fail)
		if err != nil {
			return nil, err
		}
		parsed[i] = parts
		total += n
	}

	names := make([]string, 0, total)
	for _, parts := range parsed {
		names = appendProduct(names, parts)
	}
	return names, nil
}

// failFunc builds an *Error at a byte offset of the input.
type failFunc func(pos int, format string, args ...any) *Error

func failer(what, expr string) failFunc {
	return func(pos int, format string, args ...any) *Error {
		return &Error{What: what, Expr: expr, Pos: pos, Msg: fmt.Sprintf(format, args...)}
	}
}

// span is a half-open byte range [start, end) of the expression.
type span struct{ start, end int }

// splitTop splits at commas outside brackets and checks bracket balance and
// characters, so later stages see well-formed elements.
func splitTop(expr string, fail failFunc) ([]span, error) {
	var elems []span
	open := -1 // offset of the unclosed '[', or -1
	start := 0
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '[':
			if open >= 0 {
				return nil, fail(i, "nested '[' inside the '[' at offset %d, expected ']'", open)
			}
			open = i
		case c == ']':
			if open < 0 {
				return nil, fail(i, "']' without a matching '['")
			}
			open = -1
		case c == ',' && open < 0:
			if i == start {
				return nil, fail(i, "empty element, expected a host name before ','")
			}
			elems = append(elems, span{start, i})
			start = i + 1
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			return nil, fail(i, "whitespace is not allowed, expected ',' between names")
		case c < 0x20 || c == 0x7f:
			return nil, fail(i, "control character %q is not allowed", c)
		}
	}
	if open >= 0 {
		return nil, fail(open, "'[' is never closed, expected ']'")
	}
	if start == len(expr) {
		return nil, fail(start, "empty element, expected a host name after ','")
	}
	return append(elems, span{start, len(expr)}), nil
}

// parseElement parses expr[start:end] (balanced, no top-level comma) into
// literal and bracket parts and returns how many names it expands to. It
// fails when that count would exceed budget.
func parseElement(expr string, start, end, budget int, fail failFunc) ([]part, int, error) {
	var parts []part
	count := 1
	i := start
	for i < end {
		j := strings.IndexByte(expr[i:end], '[')
		if j < 0 {
			parts = append(parts, part{text: expr[i:end]})
			break
		}
		if j > 0 {
			parts = append(parts, part{text: expr[i : i+j]})
		}
		open := i + j
		closeAt := open + strings.IndexByte(expr[open:end], ']') // balanced by splitTop
		ranges, n, err := parseRanges(expr, open+1, closeAt, fail)
		if err != nil {
			return nil, 0, err
		}
		// count*n > budget, written so that it cannot overflow.
		if n > budget/count {
			return nil, 0, tooLarge(expr, start, end, open, fail)
		}
		count *= n
		parts = append(parts, part{ranges: ranges})
		i = closeAt + 1
	}
	if count > budget {
		return nil, 0, tooLarge(expr, start, end, start, fail)
	}
	return parts, count, nil
}

func tooLarge(expr string, start, end, pos int, fail failFunc) error {
	err := fail(pos, "%q expands to more than %d names in total", expr[start:end], MaxNames)
	err.Err = ErrTooLarge
	return err
}

// parseRanges parses the inside of one bracket group, expr[start:end], and
// returns its items and how many values they hold (capped at MaxNames+1 so
// the caller's budget check can fail without overflow).
func parseRanges(expr string, start, end int, fail failFunc) ([]rng, int, error) {
	if start == end {
		return nil, 0, fail(start-1, "empty brackets, expected a number or range inside '[]'")
	}
	var out []rng
	n := 0
	i := start
	after := "'['"
	for {
		lo, loEnd, err := number(expr, i, end, after, fail)
		if err != nil {
			return nil, 0, err
		}
		r := rng{lo: lo, hi: lo, width: loEnd - i}
		i = loEnd
		if i < end && expr[i] == '-' {
			hi, hiEnd, err := number(expr, i+1, end, "'-'", fail)
			if err != nil {
				return nil, 0, err
			}
			if hi < lo {
				return nil, 0, fail(i+1, "range %s-%s goes backwards, expected lo <= hi", expr[i-r.width:i], expr[i+1:hiEnd])
			}
			r.hi = hi
			i = hiEnd
		}
		out = append(out, r)
		if size := r.hi - r.lo + 1; size > MaxNames || n+int(size) > MaxNames {
			n = MaxNames + 1
		} else {
			n += int(size)
		}
		if i == end {
			return out, n, nil
		}
		if expr[i] != ',' {
			return nil, 0, fail(i, "expected ',' or ']' after a number, found %q", expr[i])
		}
		i++
		after = "','"
	}
}

// number reads the decimal digits at expr[i:end]. after names what precedes
// them, for the message when there are none.
func number(expr string, i, end int, after string, fail failFunc) (uint64, int, error) {
	j := i
	for j < end && expr[j] >= '0' && expr[j] <= '9' {
		j++
	}
	switch {
	case j == i && i == end:
		return 0, 0, fail(i, "expected a number after %s, found ']'", after)
	case j == i:
		return 0, 0, fail(i, "expected a number after %s, found %q", after, expr[i])
	case j-i > maxDigits:
		return 0, 0, fail(i, "number %s is too long (more than %d digits)", expr[i:j], maxDigits)
	}
	v, err := strconv.ParseUint(expr[i:j], 10, 64)
	if err != nil { // unreachable: at most maxDigits digits
		return 0, 0, fail(i, "bad number %s: %v", expr[i:j], err)
	}
	return v, j, nil
}

// appendProduct appends the cartesian product of parts to names in SLURM's
// order. With one bracket group that is just the group's values. With
// several, SLURM (checked against scontrol of slurm 22.05) varies the last
// group fastest, then the first, the second, and so on, so the next-to-last
// group varies slowest: "a[1-2]b[1-2]c[1-2]" is a1b1c1 a1b1c2 a2b1c1 a2b1c2
// a1b2c1 ... For two groups this is the familiar leftmost-slowest order.
func appendProduct(names []string, parts []part) []string {
	// Materialize each part's values once; the caller has already bounded
	// the product, and every group holds at most that many values.
	vals := make([][]string, len(parts))
	var groups []int // indices of the bracket groups in parts
	for i, p := range parts {
		if p.ranges == nil {
			vals[i] = []string{p.text}
			continue
		}
		groups = append(groups, i)
		for _, r := range p.ranges {
			for v := r.lo; ; v++ {
				vals[i] = append(vals[i], pad(v, r.width))
				if v == r.hi {
					break
				}
			}
		}
	}
	// order lists the groups from fastest to slowest varying.
	var order []int
	if len(groups) > 0 {
		order = append([]int{groups[len(groups)-1]}, groups[:len(groups)-1]...)
	}
	idx := make([]int, len(parts))
	var b strings.Builder
	for {
		b.Reset()
		for i, v := range vals {
			b.WriteString(v[idx[i]])
		}
		names = append(names, b.String())
		// Advance the odometer in that order.
		done := true
		for _, k := range order {
			idx[k]++
			if idx[k] < len(vals[k]) {
				done = false
				break
			}
			idx[k] = 0
		}
		if done {
			return names
		}
	}
}

// pad formats v with at least width digits, zero-padded on the left.
func pad(v uint64, width int) string {
	s := strconv.FormatUint(v, 10)
	if len(s) >= width {
		return s
	}
	return strings.Repeat("0", width-len(s)) + s
}

// ParseTasksPerNode expands SLURM_TASKS_PER_NODE, e.g. "2(x3),1" gives
// [2 2 2 1]: comma-separated counts, each optionally followed by "(xR)" to
// repeat it R times. The result lines up with Expand(SLURM_JOB_NODELIST).
//
// A count of 0 is accepted (a node of the allocation that gets no task) so
// the result stays aligned with the node list; callers skip such nodes. A
// repeat of 0 is an error. Every error is an *Error.
func ParseTasksPerNode(s string) ([]int, error) {
	fail := failer("tasks-per-node", s)
	if s == "" {
		return nil, fail(0, "empty value, expected counts such as 2(x3),1")
	}
	var out []int
	i := 0
	for {
		count, j, err := decimal(s, i, "a task count", fail)
		if err != nil {
			return nil, err
		}
		repeat := uint64(1)
		if j < len(s) && s[j] == '(' {
			if j+1 >= len(s) || s[j+1] != 'x' {
				return nil, fail(j+1, "expected 'x' after '(' as in 2(x3)")
			}
			var k int
			repeat, k, err = decimal(s, j+2, "a repeat count after '(x'", fail)
			if err != nil {
				return nil, err
			}
			if repeat == 0 {
				return nil, fail(j+2, "repeat count must be at least 1, got 0")
			}
			if k >= len(s) || s[k] != ')' {
				return nil, fail(k, "expected ')' after the repeat count")
			}
			j = k + 1
		}
		if count > MaxNames {
			return nil, fail(i, "task count %d is larger than %d", count, MaxNames)
		}
		if repeat > uint64(MaxNames-len(out)) {
			e := fail(i, "expands to more than %d nodes in total", MaxNames)
			e.Err = ErrTooLarge
			return nil, e
		}
		for range repeat {
			out = append(out, int(count))
		}
		if j == len(s) {
			return out, nil
		}
		if s[j] != ',' {
			return nil, fail(j, "expected ',' or '(x' after a count, found %q", s[j])
		}
		i = j + 1
	}
}

// decimal reads an unsigned decimal number at s[i:].
func decimal(s string, i int, what string, fail failFunc) (uint64, int, error) {
	j := i
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	switch {
	case j == i && i == len(s):
		return 0, 0, fail(i, "expected %s, found the end", what)
	case j == i:
		return 0, 0, fail(i, "expected %s, found %q", what, s[i])
	case j-i > maxDigits:
		return 0, 0, fail(i, "number %s is too long (more than %d digits)", s[i:j], maxDigits)
	}
	v, err := strconv.ParseUint(s[i:j], 10, 64)
	if err != nil { // unreachable: at most maxDigits digits
		return 0, 0, fail(i, "bad number %s: %v", s[i:j], err)
	}
	return v, j, nil
}

// NodeTasks is one node of a SLURM allocation and the number of tasks SLURM
// placed on it.
type NodeTasks struct {
	Name  string
	Tasks int
}

// ErrMismatch is returned (wrapped) by ZipTasks when the node list and the
// task counts do not describe the same number of nodes.
var ErrMismatch = errors.New("hostlist: node list and task counts differ in length")

// ZipTasks pairs SLURM_JOB_NODELIST (or SLURM_STEP_NODELIST) with
// SLURM_TASKS_PER_NODE (or SLURM_STEP_TASKS_PER_NODE), node by node, in
// SLURM's order; gorun derives hosts and slots from it inside an allocation,
// and ranks of a direct srun derive their node rank from it. Nodes with 0
// tasks are kept, so indices match SLURM_NODEID.
func ZipTasks(nodelist, tasksPerNode string) ([]NodeTasks, error) {
	nodes, err := Expand(nodelist)
	if err != nil {
		return nil, err
	}
	tasks, err := ParseTasksPerNode(tasksPerNode)
	if err != nil {
		return nil, err
	}
	if len(nodes) != len(tasks) {
		return nil, fmt.Errorf("%w: %q has %d nodes, %q has %d counts", ErrMismatch, nodelist, len(nodes), tasksPerNode, len(tasks))
	}
	out := make([]NodeTasks, len(nodes))
	for i := range nodes {
		out[i] = NodeTasks{Name: nodes[i], Tasks: tasks[i]}
	}
	return out, nil
}
