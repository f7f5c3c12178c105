//go:build cgo

package main

/*
#include <stdint.h>
#include <stdlib.h>
#define GORUN_NO_PROTOTYPES
#include "gorun.h"
void gorunSetError(const char *text, size_t n, int rank);
*/
import "C"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/handles"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// The eager executor's section of the ABI (gorun.h, "executor"): overlap's
// Executor driven from a framework's hooks. The framework hands in a planned
// step graph once; every step its hooks say which tensor is ready and which
// result they need, and the executor packs, issues in plan order, checks the
// plan hash and scatters, on Go threads, while the caller's interpreter lock
// is released (ctypes releases it for every call).
//
// What this file adds to overlap's contract: regions. A framework enters
// its regions (module paths) in forward order; entering one out of the
// plan's order is refused at once with an error that names both regions,
// instead of letting ranks drift into different collectives.

// execEntry is one executor a C handle names. mu serialises the calls of
// the host program's threads (torch runs backward hooks on its own
// threads); the Executor itself is driven by one caller at a time.
type execEntry struct {
	mu     sync.Mutex
	ex     *overlap.Executor
	ce     *commEntry            // the first group's communicator, to name lost ranks
	groups map[string]*commEntry // by the plan's group names
	// regions is the plan's forward order; next is the index the next
	// entered region may not precede (regions may be skipped, not revisited).
	regions []string
	pos     map[string]int
	next    int
	last    string
	// pin keeps View's slots where C may hold them (runtime.Pinner): the
	// executor owns them for its life, and Go's collector may not move or
	// free them while the host program writes gradients there.
	pin runtime.Pinner
}

// execs maps gorun_executor_t handles to executors.
var execs = handles.New[*execEntry]("executor", "freed, or never made")

func execOf(h C.gorun_executor_t) (*execEntry, error) {
	e, err := execs.Get(int64(h))
	if err != nil {
		return nil, invalidHandle(err)
	}
	return e, nil
}

// execErr records err for the caller. A plan mismatch becomes
// GORUN_ERR_DESYNC naming, as the error's rank, the first world rank whose
// plan differs from this rank's; its text starts with "gorun: plan
// mismatch:", which bindings map to their own error type.
func execErr(err error, e *execEntry) C.int {
	var pm *overlap.PlanMismatchError
	var ce *commEntry
	if e != nil {
		ce = e.ce
	}
	if errors.As(err, &pm) {
		rank := -1
		if g := e.groups[pm.Group]; g != nil && len(pm.Others) > 0 && pm.Others[0] < g.c.Size() {
			rank = g.c.Group().GlobalRank(pm.Others[0])
		}
		text := fmt.Sprintf("gorun: plan mismatch: %v", err)
		C.gorunSetError((*C.char)(unsafe.Pointer(unsafe.StringData(text))), C.size_t(len(text)), C.int(rank))
		return statusDesync
	}
	return setErr(err, ce)
}

// parseExecConfig reads "key=value" settings: trace=0|1, flush=0|1
// (start buckets with unproduced members zero-filled at the end of the
// step, as DDP does for unused parameters), check=0|1 (the per-step plan
// hash exchange; on by default), mode=native|serial.
func parseExecConfig(s string) (overlap.Config, error) {
	cfg := overlap.DefaultConfig()
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return cfg, fmt.Errorf("%w: executor config %q: want key=value", errInvalid, f)
		}
		flag := func() (bool, error) { return boolSetting("executor config", k, v) }
		var err error
		switch k {
		case "trace":
			cfg.Trace, err = flag()
		case "flush":
			cfg.FlushPartial, err = flag()
		case "check":
			cfg.CheckPlan, err = flag()
		case "mode":
			switch v {
			case "native":
				cfg.Mode = overlap.Native
			case "serial":
				cfg.Mode = overlap.Serial
			default:
				err = fmt.Errorf("%w: executor config mode=%q: want native or serial", errInvalid, v)
			}
		default:
			err = fmt.Errorf("%w: executor config: unknown key %q (known: trace, flush, check, mode)", errInvalid, k)
		}
		if err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

//export gorun_executor_new
func gorun_executor_new(graph *C.char, n C.size_t, groups **C.char, comms *C.gorun_comm_t, ngroups C.int,
	config *C.char, out *C.gorun_executor_t) (rc C.int) {
	defer guard(&rc)
	if graph == nil || out == nil || ngroups <= 0 || groups == nil || comms == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_new: need a graph, at least one group and an out handle", errInvalid), nil)
	}
	g, err := stepgraph.Load(bytes.NewReader(C.GoBytes(unsafe.Pointer(graph), C.int(n))))
	if err != nil {
		return setErr(fmt.Errorf("%w: gorun_executor_new: %w", errInvalid, err), nil)
	}
	plan, err := stepgraph.Plan(g)
	if err != nil {
		return setErr(fmt.Errorf("%w: gorun_executor_new: %w", errInvalid, err), nil)
	}
	var cfgText string
	if config != nil {
		cfgText = C.GoString(config)
	}
	cfg, err := parseExecConfig(cfgText)
	if err != nil {
		return setErr(err, nil)
	}
	cs := map[string]overlap.Comm{}
	byName := map[string]*commEntry{}
	var first *commEntry
	names := unsafe.Slice(groups, int(ngroups))
	hs := unsafe.Slice(comms, int(ngroups))
	for i := range names {
		ce, err := reg.comm(int64(hs[i]))
		if err != nil {
			return setErr(fmt.Errorf("gorun_executor_new: group %d: %w", i, err), nil)
		}
		cs[C.GoString(names[i])] = ce.c
		byName[C.GoString(names[i])] = ce
		if first == nil {
			first = ce
		}
	}
	ex, err := overlap.New(plan, cs, cfg)
	if err != nil {
		return setErr(fmt.Errorf("%w: gorun_executor_new: %w", errInvalid, err), nil)
	}
	e := &execEntry{ex: ex, ce: first, groups: byName, regions: g.Regions, pos: map[string]int{}}
	for i, r := range g.Regions {
		e.pos[r] = i
	}
	*out = C.gorun_executor_t(execs.Add(e))
	return ok()
}

//export gorun_executor_hash
func gorun_executor_hash(h C.gorun_executor_t, hash *C.uint64_t) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil || hash == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_hash: %v", errInvalid, err), nil)
	}
	*hash = C.uint64_t(e.ex.Plan().Hash())
	return ok()
}

//export gorun_executor_begin
func gorun_executor_begin(h C.gorun_executor_t, step C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.next, e.last = 0, ""
	if err := e.ex.Begin(int(step)); err != nil {
		return execErr(err, e)
	}
	return ok()
}

//export gorun_executor_enter
func gorun_executor_enter(h C.gorun_executor_t, region *C.char) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	if region == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_enter: region is NULL", errInvalid), nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.enterLocked(C.GoString(region)); err != nil {
		return setErr(err, nil)
	}
	return ok()
}

// enterLocked is the region-order rule: regions run in the plan's forward
// order; one may be skipped (not run this step), none revisited.
func (e *execEntry) enterLocked(r string) error {
	i, known := e.pos[r]
	switch {
	case !known:
		return fmt.Errorf("%w: region %q is not in the plan (its regions: %s)", errInvalid, r, strings.Join(e.regions, ", "))
	case i < e.next:
		after := "the step's start"
		if e.last != "" {
			after = fmt.Sprintf("region %q", e.last)
		}
		return fmt.Errorf("%w: region %q entered out of the plan's order: it is region %d of %d, and %s came before it "+
			"(a module called twice in one step, or a forward that differs from the planned one)",
			errInvalid, r, i+1, len(e.regions), after)
	}
	e.next, e.last = i+1, r
	if e.ex == nil {
		return nil // a rule without an executor (tests)
	}
	if tl := e.ex.Timeline(); tl != nil {
		tl.Mark("forward "+r, time.Now(), nil)
	}
	return nil
}

//export gorun_executor_mark
func gorun_executor_mark(h C.gorun_executor_t, name *C.char) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	if name == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_mark: name is NULL", errInvalid), nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if tl := e.ex.Timeline(); tl != nil {
		tl.Mark(C.GoString(name), time.Now(), nil)
	}
	return ok()
}

// bufOf views n bytes at p as a comm buffer of dtype dt.
func bufOf(p unsafe.Pointer, n C.size_t, dtype C.int, what string) (comm.Buffer, error) {
	dt, _, err := dtypeOp(dtype, 0)
	if err != nil {
		return nil, err
	}
	es := C.size_t(dt.Size())
	if n%es != 0 {
		return nil, fmt.Errorf("%w: %s: %d bytes is not a whole number of %v elements", errInvalid, what, n, dt)
	}
	return buffer(p, n/es, dt, what, false)
}

//export gorun_executor_ready
func gorun_executor_ready(h C.gorun_executor_t, tensor *C.char, in unsafe.Pointer, inBytes C.size_t,
	out unsafe.Pointer, outBytes C.size_t, dtype C.int) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	if tensor == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_ready: tensor is NULL", errInvalid), nil)
	}
	name := C.GoString(tensor)
	ib, err := bufOf(in, inBytes, dtype, name+": in")
	if err != nil {
		return setErr(err, nil)
	}
	ob, err := bufOf(out, outBytes, dtype, name+": out")
	if err != nil {
		return setErr(err, nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.ex.Ready(context.Background(), name, ib, ob); err != nil {
		return execErr(err, e)
	}
	return ok()
}

//export gorun_executor_wait
func gorun_executor_wait(h C.gorun_executor_t, out *C.char) (rc C.int) {
	defer guard(&rc)
	return onNamed(h, "gorun_executor_wait", "out", out, func(e *execEntry, name string) error {
		return e.ex.Wait(context.Background(), name)
	})
}

//export gorun_executor_end_region
func gorun_executor_end_region(h C.gorun_executor_t, region *C.char) (rc C.int) {
	defer guard(&rc)
	return onNamed(h, "gorun_executor_end_region", "region", region, func(e *execEntry, name string) error {
		return e.ex.EndRegion(context.Background(), name)
	})
}

// onNamed runs f under the executor's lock for a call that takes one name
// (call names the C function and arg its argument in a NULL error).
func onNamed(h C.gorun_executor_t, call, arg string, name *C.char, f func(e *execEntry, name string) error) C.int {
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	if name == nil {
		return setErr(fmt.Errorf("%w: %s: %s is NULL", errInvalid, call, arg), nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := f(e, C.GoString(name)); err != nil {
		return execErr(err, e)
	}
	return ok()
}

//export gorun_executor_view
func gorun_executor_view(h C.gorun_executor_t, tensor *C.char, ptr *unsafe.Pointer, n *C.size_t) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	if tensor == nil || ptr == nil || n == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_view: NULL argument", errInvalid), nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	buf, err := e.ex.View(C.GoString(tensor))
	if err != nil {
		return execErr(err, e)
	}
	b, _ := buf.Host()
	if len(b) == 0 {
		*ptr, *n = nil, 0
		return ok()
	}
	e.pin.Pin(&b[0])
	*ptr, *n = unsafe.Pointer(&b[0]), C.size_t(len(b))
	return ok()
}

// execMetrics is gorun_executor_finish's JSON: overlap.StepMetrics in
// nanoseconds and bytes.
type execMetrics struct {
	Step           int   `json:"step"`
	TimeNs         int64 `json:"time_ns"`
	CommNs         int64 `json:"comm_ns"`
	ExposedNs      int64 `json:"exposed_ns"`
	Collectives    int   `json:"collectives"`
	Bytes          int64 `json:"bytes"`
	FusedPeakBytes int64 `json:"fused_peak_bytes"`
	CopiedBytes    int64 `json:"copied_bytes"`
	Buckets        int   `json:"buckets"`
}

//export gorun_executor_finish
func gorun_executor_finish(h C.gorun_executor_t, metrics *C.char, capacity C.size_t, length *C.size_t) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	e.mu.Lock()
	m, err := e.ex.Finish(context.Background())
	e.mu.Unlock()
	if err != nil {
		return execErr(err, e)
	}
	nb := 0
	for _, g := range e.ex.Plan().Groups {
		nb += len(g.Buckets)
	}
	js, _ := json.Marshal(execMetrics{Step: m.Step, TimeNs: m.Time.Nanoseconds(), CommNs: m.Comm.Nanoseconds(),
		ExposedNs: m.Exposed.Nanoseconds(), Collectives: m.Collectives, Bytes: m.Bytes,
		FusedPeakBytes: m.FusedPeakBytes, CopiedBytes: m.CopiedBytes, Buckets: nb})
	if length != nil {
		*length = C.size_t(len(js))
	}
	if metrics != nil && capacity > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(metrics)), int(capacity))
		k := copy(dst[:len(dst)-1], js)
		dst[k] = 0
	}
	return ok()
}

//export gorun_executor_plan
func gorun_executor_plan(h C.gorun_executor_t, buf *C.char, capacity C.size_t, length *C.size_t) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	js, err := json.Marshal(e.ex.Plan())
	if err != nil {
		return setErr(err, nil)
	}
	if length != nil {
		*length = C.size_t(len(js))
	}
	if buf != nil && capacity > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity))
		k := copy(dst[:len(dst)-1], js)
		dst[k] = 0
	}
	return ok()
}

//export gorun_executor_trace
func gorun_executor_trace(h C.gorun_executor_t, path *C.char) (rc C.int) {
	defer guard(&rc)
	e, err := execOf(h)
	if err != nil {
		return setErr(err, nil)
	}
	if path == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_trace: path is NULL", errInvalid), nil)
	}
	tl := e.ex.Timeline()
	if tl == nil {
		return setErr(fmt.Errorf("%w: gorun_executor_trace: the executor records no trace (config trace=1)", errInvalid), nil)
	}
	p := C.GoString(path)
	f, err := os.Create(p)
	if err != nil {
		return setErr(fmt.Errorf("gorun_executor_trace: %w", err), nil)
	}
	e.mu.Lock()
	_, werr := tl.WriteTo(f)
	e.mu.Unlock()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(p)
		return setErr(fmt.Errorf("gorun_executor_trace: %s: %w", p, werr), nil)
	}
	return ok()
}

//export gorun_executor_free
func gorun_executor_free(h C.gorun_executor_t) (rc C.int) {
	defer guard(&rc)
	e, err := execs.Take(int64(h))
	if err != nil {
		return setErr(fmt.Errorf("%w: gorun_executor_free: %w", errInvalid, err), nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	err = e.ex.Close()
	e.pin.Unpin()
	if err != nil {
		return setErr(fmt.Errorf("gorun_executor_free: %w", err), nil)
	}
	return ok()
}
