package comm

import (
	"context"
	"fmt"
	"sync"
)

// A Label names, in flight records, the caller's own call that issued a
// collective: a binding's API name ("all_reduce_coalesced",
// "reduce_scatter_tensor") where comm's Kind alone ("AllReduce") says too
// little. A label is a small number, so that the recorder's slots stay
// word-sized; its name lives in a process-wide table, read only when records
// are copied out. 0 is no label: a call issued without one is recorded as
// before.
type Label uint16

// maxLabels is how many names the table holds (Label's range less 0).
const maxLabels = 1<<16 - 1

var labels struct {
	mu    sync.Mutex
	names []string // names[l-1] is label l
	ids   map[string]Label
}

// RegisterLabel returns the label of name, adding it to the table on first
// use. Safe for concurrent use; meant for a binding's fixed set of names,
// each registered once.
func RegisterLabel(name string) (Label, error) {
	if name == "" {
		return 0, fmt.Errorf("%w: flight record label: empty name", ErrInvalidArgument)
	}
	labels.mu.Lock()
	defer labels.mu.Unlock()
	if l, ok := labels.ids[name]; ok {
		return l, nil
	}
	if len(labels.names) >= maxLabels {
		return 0, fmt.Errorf("%w: flight record label %q: the table is full (%d names)", ErrInvalidArgument, name, maxLabels)
	}
	if labels.ids == nil {
		labels.ids = map[string]Label{}
	}
	labels.names = append(labels.names, name)
	l := Label(len(labels.names))
	labels.ids[name] = l
	return l, nil
}

// String is the label's name ("" for 0 or a label never registered).
func (l Label) String() string {
	if l == 0 {
		return ""
	}
	labels.mu.Lock()
	defer labels.mu.Unlock()
	if int(l) > len(labels.names) {
		return ""
	}
	return labels.names[l-1]
}

// WithLabel returns a context, otherwise parent's, whose calls are recorded
// with label l. It allocates once: a binding keeps one per label and issues
// with it (under IssuerWaits or not) without allocating per call.
func WithLabel(parent context.Context, l Label) context.Context { return labeled{parent, l} }

type labeled struct {
	context.Context
	l Label
}

type labelKey struct{}

func (c labeled) Value(key any) any {
	if key == (labelKey{}) {
		return c.l
	}
	return c.Context.Value(key)
}

// labelOf is the label a call issued with ctx is recorded with: a type
// switch for the contexts libgorun makes, Value for any other.
func labelOf(ctx context.Context) Label {
	for {
		switch c := ctx.(type) {
		case labeled:
			return c.l
		case issuerWaits:
			ctx = c.Context
		default:
			l, _ := ctx.Value(labelKey{}).(Label)
			return l
		}
	}
}
