//go:build cgo

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/overlap"
)

// TraceEnv names where a process writes a Chrome/Perfetto trace of its
// collectives: every call of every communicator it opens, from gorun_init to
// gorun_finalize (destroy_process_group, or the process's exit, for torch),
// one span per call from its start to its end, named by the caller's label
// (the torch call) or else by the call's kind, and a span on a second track
// from its issue to its start for a call that waited behind another. The
// value is a directory (one that exists, or a path ending in "/"), where the
// file is gorun-trace.rank<R>.json, or a file path, where "{rank}" is
// replaced by the world rank or else ".rank<R>.json" is added (the rule of
// gorun.torch.distribute's trace=). A later world in the same process (init
// after finalize) writes its own file, ".<n>" before ".json". Unset: no
// trace, and nothing recorded.
const TraceEnv = "GORUN_TRACE"

// traceLimit bounds the calls kept per communicator (about 200 bytes each
// while held); more are counted in the file's droppedEvents.
const traceLimit = 1 << 20

// traceSet is one world's traced communicators, written at finalize.
type traceSet struct {
	path string // the file to write
	mu   sync.Mutex
	cs   []tracedComm
}

type tracedComm struct {
	c    *comm.Comm
	name string
}

// worlds counts the worlds this process has traced, for the file name.
var traceWorlds int

// newTraceSet reads TraceEnv for a world in which this process has world
// rank rank: nil when unset, an error naming the variable when its value
// cannot be written.
func newTraceSet(rank int) (*traceSet, error) {
	v := os.Getenv(TraceEnv)
	if v == "" {
		return nil, nil
	}
	traceWorlds++
	path, err := tracePath(v, rank, traceWorlds)
	if err != nil {
		return nil, err
	}
	return &traceSet{path: path}, nil
}

// tracePath is the file TraceEnv=v names for world rank rank's n-th world,
// its directory checked now rather than at the end of the run.
func tracePath(v string, rank, n int) (string, error) {
	var path string
	if st, err := os.Stat(v); (err == nil && st.IsDir()) || strings.HasSuffix(v, "/") {
		path = filepath.Join(v, fmt.Sprintf("gorun-trace.rank%d.json", rank))
	} else if strings.Contains(v, "{rank}") {
		path = strings.ReplaceAll(v, "{rank}", fmt.Sprint(rank))
	} else {
		path = fmt.Sprintf("%s.rank%d.json", v, rank)
	}
	if n > 1 {
		path = strings.TrimSuffix(path, ".json") + fmt.Sprintf(".%d.json", n)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%w: %s=%q: directory %s does not exist", errInvalid, TraceEnv, v, filepath.Dir(path))
	}
	return path, nil
}

// add traces c from now on, as the track named name.
func (t *traceSet) add(c *comm.Comm, name string) {
	if t == nil {
		return
	}
	c.StartCallTrace(traceLimit)
	t.mu.Lock()
	t.cs = append(t.cs, tracedComm{c, name})
	t.mu.Unlock()
}

// groupName names a communicator other than the world by its world ranks.
func groupName(c *comm.Comm, n int) string {
	g := c.Group()
	rs := make([]string, 0, min(c.Size(), 9))
	for i := range min(c.Size(), 8) {
		rs = append(rs, fmt.Sprint(g.GlobalRank(i)))
	}
	if c.Size() > 8 {
		rs = append(rs, "…")
	}
	return fmt.Sprintf("group %d (ranks %s)", n, strings.Join(rs, ","))
}

// write writes the trace file (rank is the world rank, the trace's pid).
func (t *traceSet) write(rank int) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := overlap.Trace{DisplayTimeUnit: "ms"}
	meta := func(tid int, what, name string) {
		tr.TraceEvents = append(tr.TraceEvents, overlap.Event{Name: what, Ph: "M", PID: rank, TID: tid,
			Args: map[string]any{"name": name}})
	}
	meta(0, "process_name", fmt.Sprintf("rank %d", rank))
	for k, tc := range t.cs {
		calls, queued := 2*k+1, 2*k+2
		meta(calls, "thread_name", tc.name)
		meta(queued, "thread_name", tc.name+": queued")
		recs, dropped := tc.c.CallTrace()
		tr.Dropped += dropped
		for _, r := range recs {
			tr.TraceEvents = append(tr.TraceEvents, traceEvents(r, rank, calls, queued)...)
		}
	}
	b, err := json.Marshal(tr)
	if err == nil {
		err = os.WriteFile(t.path, b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("writing the trace (%s): %w", TraceEnv, err)
	}
	return nil
}

// traceEvents is one call as trace events: its run, and its wait behind
// earlier calls when it had one.
func traceEvents(r comm.FlightRecord, pid, calls, queued int) []overlap.Event {
	name := r.Label
	if name == "" {
		name = r.Call.Kind.String()
	}
	us := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e3 }
	args := map[string]any{"call": r.Call.String(), "seq": r.Call.Seq, "state": string(r.State)}
	if r.Err != "" {
		args["err"] = r.Err
	}
	if r.Fused > 1 {
		args["fused"] = r.Fused
	}
	if r.P2P {
		args["peer_seq"] = r.PeerSeq
	}
	evs := []overlap.Event{{Name: name, Cat: "collective", Ph: "X", TS: us(r.Started),
		Dur: float64(r.Ended.Sub(r.Started).Nanoseconds()) / 1e3, PID: pid, TID: calls, Args: args}}
	if r.Started.After(r.Issued) {
		evs = append(evs, overlap.Event{Name: name, Cat: "queued", Ph: "X", TS: us(r.Issued),
			Dur: float64(r.Started.Sub(r.Issued).Nanoseconds()) / 1e3, PID: pid, TID: queued,
			Args: map[string]any{"seq": r.Call.Seq}})
	}
	return evs
}
