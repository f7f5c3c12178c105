package overlap

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"
)

// Track ids on a rank's timeline: the compute stream (compute and the waits
// that block it), the step spans, then one track per group's comm stream.
const (
	tidStep    = 0
	tidCompute = 1
	tidComm0   = 10
)

// Event is one Chrome trace event (the "Trace Event Format" that
// chrome://tracing and ui.perfetto.dev load). Times are microseconds since
// the Unix epoch, so traces of ranks on one host line up when merged.
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	ID   string         `json:"id,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// Trace is a trace file: {"traceEvents": [...]}.
type Trace struct {
	TraceEvents     []Event `json:"traceEvents"`
	DisplayTimeUnit string  `json:"displayTimeUnit,omitempty"`
	// Dropped counts events past Config.TraceLimit.
	Dropped int `json:"droppedEvents,omitempty"`
}

// Timeline is one rank's recorded events. pid is the rank.
type Timeline struct {
	rank    int
	limit   int
	events  []Event
	dropped int
	comm    map[string]int // group → tid
	nextID  int
}

func newTimeline(rank, limit int) *Timeline {
	return &Timeline{rank: rank, limit: limit, comm: map[string]int{}}
}

func us(t time.Time) float64 { return float64(t.UnixNano()) / 1e3 }

func (tl *Timeline) add(e Event) {
	if tl.limit > 0 && len(tl.events) >= tl.limit {
		tl.dropped++
		return
	}
	e.PID = tl.rank
	tl.events = append(tl.events, e)
}

func (tl *Timeline) complete(tid int, name, cat string, b, e time.Time, args map[string]any) {
	tl.add(Event{Name: name, Cat: cat, Ph: "X", TS: us(b), Dur: float64(e.Sub(b).Nanoseconds()) / 1e3, TID: tid, Args: args})
}

// counter records a value over time (a "C" event: Perfetto draws it as a
// track of its own).
func (tl *Timeline) counter(name string, t time.Time, args map[string]any) {
	tl.add(Event{Name: name, Cat: "memory", Ph: "C", TS: us(t), TID: tidCompute, Args: args})
}

// async records a start→wait span; async spans may overlap one another,
// which complete events on one track may not.
func (tl *Timeline) async(name, cat string, b, e time.Time, args map[string]any) {
	tl.nextID++
	id := fmt.Sprintf("r%d.%d", tl.rank, tl.nextID)
	tl.add(Event{Name: name, Cat: cat, Ph: "b", TS: us(b), TID: tidCompute, ID: id, Args: args})
	tl.add(Event{Name: name, Cat: cat, Ph: "e", TS: us(e), TID: tidCompute, ID: id})
}

func (tl *Timeline) commTID(group string) int {
	t, ok := tl.comm[group]
	if !ok {
		t = tidComm0 + len(tl.comm)
		tl.comm[group] = t
	}
	return t
}

// Mark records a zero-length instant (e.g. "loss 3.2") on the compute track.
func (tl *Timeline) Mark(name string, at time.Time, args map[string]any) {
	tl.add(Event{Name: name, Ph: "i", TS: us(at), TID: tidCompute, Args: args})
}

// Trace returns the events so far with track and process names.
func (tl *Timeline) Trace() Trace {
	meta := func(tid int, what, name string) Event {
		return Event{Name: what, Ph: "M", PID: tl.rank, TID: tid, Args: map[string]any{"name": name}}
	}
	evs := []Event{
		meta(0, "process_name", fmt.Sprintf("rank %d", tl.rank)),
		meta(tidStep, "thread_name", "step"),
		meta(tidCompute, "thread_name", "compute"),
	}
	groups := make([]string, 0, len(tl.comm))
	for g := range tl.comm {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		evs = append(evs, meta(tl.comm[g], "thread_name", "comm "+g))
	}
	evs = append(evs, tl.events...)
	return Trace{TraceEvents: evs, DisplayTimeUnit: "ms", Dropped: tl.dropped}
}

// WriteTo writes the timeline as Chrome trace JSON.
func (tl *Timeline) WriteTo(w io.Writer) (int64, error) {
	return writeTrace(w, tl.Trace())
}

func writeTrace(w io.Writer, t Trace) (int64, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return 0, fmt.Errorf("overlap: encoding trace: %w", err)
	}
	n, err := w.Write(b)
	return int64(n), err
}

// ReadTrace parses a trace written by WriteTo (or MergeTraces).
func ReadTrace(r io.Reader) (Trace, error) {
	var t Trace
	if err := json.NewDecoder(r).Decode(&t); err != nil {
		return t, fmt.Errorf("overlap: reading trace: %w", err)
	}
	return t, nil
}

// MergeTraces combines the ranks' traces into one: every event keeps its
// pid (the rank), so each rank shows as one process; events are ordered by
// time, metadata first. Timestamps are wall-clock, so ranks on one host line
// up exactly and ranks on different hosts up to their clocks' offset.
func MergeTraces(w io.Writer, traces ...Trace) error {
	var out Trace
	out.DisplayTimeUnit = "ms"
	for _, t := range traces {
		out.TraceEvents = append(out.TraceEvents, t.TraceEvents...)
		out.Dropped += t.Dropped
	}
	sort.SliceStable(out.TraceEvents, func(i, j int) bool {
		a, b := out.TraceEvents[i], out.TraceEvents[j]
		if (a.Ph == "M") != (b.Ph == "M") {
			return a.Ph == "M"
		}
		if a.TS != b.TS {
			return a.TS < b.TS
		}
		return a.PID < b.PID
	})
	_, err := writeTrace(w, out)
	return err
}
