//go:build cgo

package main

/*
#include <stdint.h>
#include <stdlib.h>
#define GORUN_NO_PROTOTYPES
#include "gorun.h"
void gorunSetError(const char *text, size_t n, int rank);

// cgo cannot call a C function pointer itself; these do.
static int gorunFtCallSave(gorun_ft_save_fn f, void *user, const void **buf, size_t *len) {
	return f(user, buf, len);
}
static int gorunFtCallLoad(gorun_ft_load_fn f, void *user, const void *buf, size_t len) {
	return f(user, buf, len);
}
extern char **environ;
static char **gorunEnviron(void) { return environ; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/internal/collateral"
	"github.com/gorun-hpc/gorun/internal/handles"
	"github.com/gorun-hpc/gorun/internal/netfault"
)

// This file is the C face of package ft (gorun.h's "fault tolerance"
// section): a replica of a `gorun --fault-tolerant` job joins, asks for
// each step's quorum, averages its gradients over the quorum's
// participants, asks whether the step counts, and hands over its state as
// bytes through two callbacks that the heal calls from inside the quorum.
// Quorum, heal and commit are ft's; this maps handles, buffers, callbacks
// and errors.

// forkedAtEnv is set (by python/gorun/_forkserver.py) in a replacement
// forked from gorun's fork server, whose environment was replaced through
// C's setenv after the process started.
const forkedAtEnv = "GORUN_FT_FORKED_AT"

func init() { adoptForkedEnviron() }

// adoptForkedEnviron makes Go's copy of the environment C's in a process
// forked from the fork server. Go's runtime in a shared library reads the
// environment the process started with (the server's: another rank's
// identity, no collateral descriptor) and never C's later changes; every
// other process is left as it is.
func adoptForkedEnviron() {
	cenv := map[string]string{}
	for p := C.gorunEnviron(); p != nil && *p != nil; p = (**C.char)(unsafe.Add(unsafe.Pointer(p), unsafe.Sizeof(*p))) {
		if k, v, ok := strings.Cut(C.GoString(*p), "="); ok {
			cenv[k] = v
		}
	}
	if _, forked := cenv[forkedAtEnv]; !forked {
		return
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "" {
			if _, ok := cenv[k]; !ok {
				_ = os.Unsetenv(k)
			}
		}
	}
	for k, v := range cenv {
		if cur, ok := os.LookupEnv(k); !ok || cur != v {
			_ = os.Setenv(k, v)
		}
	}
}

// ftEntry is a Manager a C handle names, with the state callbacks the
// caller set.
type ftEntry struct {
	m *ft.Manager

	// mu guards the callbacks; the heal reads them from inside Quorum, on
	// the caller's thread, so a change between quorums is seen by the next.
	mu   sync.Mutex
	save C.gorun_ft_save_fn
	load C.gorun_ft_load_fn
	user unsafe.Pointer // the caller's, handed back to the callbacks; never a Go pointer

	// commMu guards the communicator handle gorun_ft_comm gave out: commH
	// names commOf (the quorum's communicator then) in the library's
	// communicator registry, until the quorum's communicator changes or
	// the handle is closed. Order: commMu before reg's locks.
	commMu sync.Mutex
	commH  int64
	commOf *comm.Comm
	// groupH names groupOf (the replica group's communicator, HSDP) the
	// same way, for gorun_ft_group_comm; guarded by commMu too.
	groupH  int64
	groupOf *comm.Comm
}

// dropGroupLocked forgets the handle gorun_ft_group_comm gave out.
func (e *ftEntry) dropGroupLocked() {
	if e.groupH != 0 {
		reg.comms.Drop(e.groupH)
	}
	e.groupH, e.groupOf = 0, nil
}

// borrow names c in the library's communicator registry; ft owns it, so
// the handle's close does nothing.
func borrow(c *comm.Comm) int64 {
	return reg.comms.Add(&commEntry{c: c, borrowed: true, close: func() error { return nil }})
}

// dropCommLocked forgets the handle gorun_ft_comm gave out, so that a
// stale one is refused ("freed") rather than used on a closed
// communicator.
func (e *ftEntry) dropCommLocked() {
	if e.commH != 0 {
		reg.comms.Drop(e.commH)
	}
	e.commH, e.commOf = 0, nil
}

// ftRegistry maps gorun_ft_t handles to Managers. It is independent of
// gorun_init's registry: a fault-tolerant replica does not join the gossip
// world (package ft).
type ftRegistry struct {
	*handles.Table[*ftEntry]
}

var ftReg = ftRegistry{handles.New[*ftEntry]("fault-tolerance handle", "closed, or never joined")}

// get returns the Manager h names; what is the call, for the error.
func (r ftRegistry) get(h C.gorun_ft_t, what string) (*ftEntry, error) {
	e, err := r.Get(int64(h))
	if err != nil {
		return nil, fmt.Errorf("%w: gorun_ft_%s: %w", errInvalid, what, err)
	}
	return e, nil
}

// ftSettings are gorun_ft_join's config string, parsed.
type ftSettings struct {
	dial    time.Duration // Config.DialTimeout (0: ft's default)
	connect time.Duration // Config.Comm.ConnectTimeout (0: ft's default)
	tcp     bool          // no shared memory between replicas
	env     map[string]string
}

// parseFTSettings reads "key=value ..."; an unknown key or bad value is an
// error naming it.
func parseFTSettings(s string) (ftSettings, error) {
	st := ftSettings{env: map[string]string{}}
	ms := func(k, v string) (time.Duration, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%w: ft config %s=%q: want a whole number of milliseconds > 0", errInvalid, k, v)
		}
		return time.Duration(n) * time.Millisecond, nil
	}
	for _, f := range strings.Fields(s) {
		k, v, found := strings.Cut(f, "=")
		if !found {
			return st, fmt.Errorf("%w: ft config %q: want key=value", errInvalid, f)
		}
		var err error
		switch {
		case strings.HasPrefix(k, "env."):
			name := strings.TrimPrefix(k, "env.")
			if name == "" {
				return st, fmt.Errorf("%w: ft config %q: want env.NAME=VALUE", errInvalid, f)
			}
			st.env[name] = v
		case k == "dial_timeout_ms":
			st.dial, err = ms(k, v)
		case k == "connect_timeout_ms":
			st.connect, err = ms(k, v)
		case k == "tcp":
			st.tcp, err = boolSetting("ft config", k, v)
		default:
			err = fmt.Errorf("%w: ft config: unknown key %q (known: dial_timeout_ms, connect_timeout_ms, tcp, env.NAME)", errInvalid, k)
		}
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

// ftErr records err as the thread's error text and returns its status:
// ft's own failures first, then comm's (classify).
func ftErr(err error) C.int {
	code := -1
	switch {
	case errors.Is(err, ft.ErrConfig), errors.Is(err, ft.ErrPhase), errors.Is(err, ft.ErrNoState):
		code = statusInvalid
	case errors.Is(err, ft.ErrNotFaultTolerant), errors.Is(err, ft.ErrAuth):
		code = statusInit
	case errors.Is(err, ft.ErrClosed), errors.Is(err, ft.ErrFinished):
		// ErrFinished: the replicas that held the job's last step have
		// finished and left; this one (a late replacement) is done too.
		code = statusClosed
	case errors.Is(err, context.DeadlineExceeded):
		code = statusTimeout
	case errors.Is(err, ft.ErrHeal):
		// The heal failed on this side (a callback's error, a digest
		// that did not match): not a lost peer, and not the caller's
		// argument; the text says which.
		code = statusAborted
	case errors.Is(err, ft.ErrServiceLost), errors.Is(err, ft.ErrQuorumFailed):
		code = statusPeerLost
	}
	if code < 0 {
		return setErr(err, nil)
	}
	text := err.Error()
	C.gorunSetError((*C.char)(unsafe.Pointer(unsafe.StringData(text))), C.size_t(len(text)), -1)
	return C.int(code)
}

// callCtx is a context bounded by timeoutMs (<= 0: none).
func callCtx(timeoutMs C.int64_t) (context.Context, context.CancelFunc) {
	if timeoutMs > 0 {
		return context.WithTimeout(context.Background(), time.Duration(timeoutMs)*time.Millisecond)
	}
	return context.WithCancel(context.Background())
}

//export gorun_ft_join
func gorun_ft_join(config *C.char, out *C.gorun_ft_t) (rc C.int) {
	defer guard(&rc)
	if out == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_join: out is NULL", errInvalid), nil)
	}
	var s string
	if config != nil {
		s = C.GoString(config)
	}
	st, err := parseFTSettings(s)
	if err != nil {
		return setErr(err, nil)
	}
	cfg := ft.DefaultConfig()
	if st.dial > 0 {
		cfg.DialTimeout = st.dial
	}
	if st.connect > 0 {
		cfg.Comm.ConnectTimeout = st.connect
	}
	cfg.Endpoint.ForceTCP = st.tcp
	env := st.env
	cfg.Lookup = func(name string) (string, bool) {
		if v, ok := env[name]; ok {
			return v, true
		}
		return os.LookupEnv(name)
	}
	m, err := ft.Join(context.Background(), cfg)
	if err != nil {
		return ftErr(fmt.Errorf("gorun_ft_join: %w", err))
	}
	*out = C.gorun_ft_t(ftReg.Add(&ftEntry{m: m}))
	return ok()
}

//export gorun_ft_info
func gorun_ft_info(h C.gorun_ft_t, replica, replicas, incarnation *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "info")
	if err != nil {
		return setErr(err, nil)
	}
	if replica != nil {
		*replica = C.int(e.m.Replica())
	}
	if replicas != nil {
		*replicas = C.int(e.m.Replicas())
	}
	if incarnation != nil {
		*incarnation = C.int(e.m.Incarnation())
	}
	return ok()
}

//export gorun_ft_set_state
func gorun_ft_set_state(h C.gorun_ft_t, save C.gorun_ft_save_fn, load C.gorun_ft_load_fn, user unsafe.Pointer) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "set_state")
	if err != nil {
		return setErr(err, nil)
	}
	if save == nil || load == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_set_state: save and load must both be set (a heal needs both sides)", errInvalid), nil)
	}
	e.mu.Lock()
	e.save, e.load, e.user = save, load, user
	e.mu.Unlock()
	e.m.SetState(ft.StateFuncs{SaveFunc: e.saveState, LoadFunc: e.loadState})
	return ok()
}

// saveState calls the caller's save callback and copies the bytes it
// points to, which are the caller's only until the callback's next call.
func (e *ftEntry) saveState() ([]byte, error) {
	e.mu.Lock()
	f, user := e.save, e.user
	e.mu.Unlock()
	var (
		p unsafe.Pointer
		n C.size_t
	)
	if rc := C.gorunFtCallSave(f, user, &p, &n); rc != 0 {
		return nil, fmt.Errorf("the state's save callback returned %d", int(rc))
	}
	if p == nil && n > 0 {
		return nil, fmt.Errorf("the state's save callback returned NULL with length %d", uint64(n))
	}
	return C.GoBytes(p, C.int(n)), nil
}

// loadState hands b to the caller's load callback for the duration of the
// call (Go memory without Go pointers, as cgo allows).
func (e *ftEntry) loadState(b []byte) error {
	e.mu.Lock()
	f, user := e.load, e.user
	e.mu.Unlock()
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	if rc := C.gorunFtCallLoad(f, user, p, C.size_t(len(b))); rc != 0 {
		return fmt.Errorf("the state's load callback returned %d", int(rc))
	}
	return nil
}

//export gorun_ft_quorum
func gorun_ft_quorum(h C.gorun_ft_t, timeoutMs C.int64_t, info *C.gorun_ft_quorum_info, participants *C.int, capacity C.int) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "quorum")
	if err != nil {
		return setErr(err, nil)
	}
	if info == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_quorum: info is NULL", errInvalid), nil)
	}
	if capacity < 0 || (capacity > 0 && participants == nil) {
		return setErr(fmt.Errorf("%w: gorun_ft_quorum: participants is NULL with capacity %d", errInvalid, capacity), nil)
	}
	if capacity > 0 && int(capacity) < e.m.Replicas() {
		return setErr(fmt.Errorf("%w: gorun_ft_quorum: participants has room for %d, a quorum may hold all %d replicas", errInvalid, capacity, e.m.Replicas()), nil)
	}
	ctx, cancel := callCtx(timeoutMs)
	defer cancel()
	q, err := e.m.Quorum(ctx)
	if err != nil {
		return ftErr(fmt.Errorf("gorun_ft_quorum: %w", err))
	}
	e.commMu.Lock()
	if c := e.m.Comm(); c != nil && e.commOf != nil && e.commOf != c {
		e.dropCommLocked()
	}
	if g := e.m.GroupComm(); g != nil && e.groupOf != nil && e.groupOf != g {
		e.dropGroupLocked()
	}
	e.commMu.Unlock()
	me := e.m.Replica()
	*info = C.gorun_ft_quorum_info{
		id:      C.int64_t(q.ID),
		step:    C.int64_t(q.Step),
		size:    C.int(q.Size()),
		rank:    C.int(q.Rank),
		healed:  boolInt(slices.Contains(q.Healed, me)),
		changed: boolInt(q.Changed),
		sources: C.int(len(q.HealSources)),
	}
	if capacity > 0 {
		out := unsafe.Slice(participants, int(capacity))
		for i, p := range q.Participants {
			out[i] = C.int(p.Replica)
		}
	}
	return ok()
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

//export gorun_ft_allreduce
func gorun_ft_allreduce(h C.gorun_ft_t, buf unsafe.Pointer, count C.size_t, dtype, op C.int, timeoutMs C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "allreduce")
	if err != nil {
		return setErr(err, nil)
	}
	dt, o, err := dtypeOp(dtype, op)
	if err == nil && o != comm.Sum && o != comm.Avg {
		err = fmt.Errorf("%w: gorun_ft_allreduce: op %v: want GORUN_SUM or GORUN_AVG", errInvalid, o)
	}
	if err == nil && dt != comm.Float32 && dt != comm.BFloat16 && dt != comm.Float16 && dt != comm.Float64 {
		err = fmt.Errorf("%w: gorun_ft_allreduce: dtype %v: want a floating-point type", errInvalid, dt)
	}
	if err != nil {
		return setErr(err, nil)
	}
	b, err := buffer(buf, count, dt, "buf", false)
	if err != nil {
		return setErr(fmt.Errorf("gorun_ft_allreduce: %w", err), nil)
	}
	ctx, cancel := callCtx(timeoutMs)
	defer cancel()
	if dt == comm.Float32 {
		err = e.m.AllReduce(ctx, unsafe.Slice((*float32)(buf), int(count)), o)
	} else {
		// ft's AllReduce takes float32; other float types go over the
		// quorum's communicator, their failure reported as the step's.
		err = allReduceOn(ctx, e.m, b, o)
	}
	if err != nil {
		return ftErr(fmt.Errorf("gorun_ft_allreduce: %w", err))
	}
	return ok()
}

// allReduceOn reduces b in place over the current quorum's communicator;
// a failure fails this replica's vote (ReportError), as ft's AllReduce
// does for float32.
func allReduceOn(ctx context.Context, m *ft.Manager, b comm.Buffer, op comm.Op) error {
	c := m.Comm()
	if c == nil {
		return fmt.Errorf("%w: no quorum yet (call gorun_ft_quorum first)", ft.ErrPhase)
	}
	if err := c.AllReduce(ctx, b, b, op).Wait(ctx); err != nil {
		err = fmt.Errorf("%w: %w", ft.ErrQuorumFailed, err)
		m.ReportError(err)
		return err
	}
	return nil
}

//export gorun_ft_comm
func gorun_ft_comm(h C.gorun_ft_t, out *C.gorun_comm_t) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "comm")
	if err != nil {
		return setErr(err, nil)
	}
	if out == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_comm: out is NULL", errInvalid), nil)
	}
	c := e.m.Comm()
	if c == nil {
		return ftErr(fmt.Errorf("gorun_ft_comm: %w: no quorum yet (call gorun_ft_quorum first)", ft.ErrPhase))
	}
	e.commMu.Lock()
	defer e.commMu.Unlock()
	if e.commOf != c {
		e.dropCommLocked()
		e.commH, e.commOf = borrow(c), c
	}
	*out = C.gorun_comm_t(e.commH)
	return ok()
}

//export gorun_ft_group
func gorun_ft_group(h C.gorun_ft_t, size, index *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "group")
	if err != nil {
		return setErr(err, nil)
	}
	// Groups are S consecutive ranks (gorun --fault-tolerant-group S), so
	// a rank's place in its group is fixed for the job: the same in every
	// incarnation and every quorum (Quorum.Group is in rank order).
	s := e.m.GroupSize()
	if size != nil {
		*size = C.int(s)
	}
	if index != nil {
		*index = C.int(e.m.Replica() % s)
	}
	return ok()
}

//export gorun_ft_group_comm
func gorun_ft_group_comm(h C.gorun_ft_t, out *C.gorun_comm_t) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "group_comm")
	if err != nil {
		return setErr(err, nil)
	}
	if out == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_group_comm: out is NULL", errInvalid), nil)
	}
	if e.m.GroupSize() <= 1 {
		return setErr(fmt.Errorf("%w: gorun_ft_group_comm: this job has no replica groups (run it with gorun --fault-tolerant-group S, S > 1)", errInvalid), nil)
	}
	g := e.m.GroupComm()
	if g == nil {
		return ftErr(fmt.Errorf("gorun_ft_group_comm: %w: no quorum yet (call gorun_ft_quorum first)", ft.ErrPhase))
	}
	e.commMu.Lock()
	defer e.commMu.Unlock()
	if e.groupOf != g {
		e.dropGroupLocked()
		e.groupH, e.groupOf = borrow(g), g
	}
	*out = C.gorun_comm_t(e.groupH)
	return ok()
}

//export gorun_ft_report_error
func gorun_ft_report_error(h C.gorun_ft_t, why *C.char) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "report_error")
	if err != nil {
		return setErr(err, nil)
	}
	text := "reported by the program"
	if why != nil {
		text = C.GoString(why)
	}
	e.m.ReportError(errors.New(text))
	return ok()
}

//export gorun_ft_should_commit
func gorun_ft_should_commit(h C.gorun_ft_t, timeoutMs C.int64_t, commit *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "should_commit")
	if err != nil {
		return setErr(err, nil)
	}
	if commit == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_should_commit: commit is NULL", errInvalid), nil)
	}
	ctx, cancel := callCtx(timeoutMs)
	defer cancel()
	yes, err := e.m.ShouldCommit(ctx)
	*commit = boolInt(yes)
	if err != nil {
		return ftErr(fmt.Errorf("gorun_ft_should_commit: %w", err))
	}
	if yes {
		// A committed step is the step gorun's --inject ...:after-steps=N
		// counts, as rank.ReportStep tells it.
		step := e.m.Step()
		collateral.TellStep(collateral.Step{Rank: e.m.Replica(), Step: step})
		netfault.ReportStep(step)
	}
	return ok()
}

//export gorun_ft_step
func gorun_ft_step(h C.gorun_ft_t, step *C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.get(h, "step")
	if err != nil {
		return setErr(err, nil)
	}
	if step == nil {
		return setErr(fmt.Errorf("%w: gorun_ft_step: step is NULL", errInvalid), nil)
	}
	*step = C.int64_t(e.m.Step())
	return ok()
}

//export gorun_ft_close
func gorun_ft_close(h C.gorun_ft_t) (rc C.int) {
	defer guard(&rc)
	e, err := ftReg.Take(int64(h))
	if err != nil {
		return setErr(fmt.Errorf("%w: gorun_ft_close: %w", errInvalid, err), nil)
	}
	e.commMu.Lock()
	e.dropCommLocked()
	e.dropGroupLocked()
	e.commMu.Unlock()
	if err := e.m.Close(); err != nil {
		return ftErr(fmt.Errorf("gorun_ft_close: %w", err))
	}
	return ok()
}
