//go:build cgo

package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
	"github.com/gorun-hpc/gorun/rankenv"
	"golang.org/x/sys/unix"
)

// settings are gorun_init's config string, parsed.
type settings struct {
	deterministic bool
	timeoutMs     int64
	forceTCP      bool
	// connectMs bounds each communicator's wait for its peers to connect
	// (comm's ConnectTimeout; 0: comm's default).
	connectMs int64
	// env holds "env.NAME=VALUE" overrides of the rank environment, as a
	// sorted "NAME=VALUE\n" list (comparable, for gorun_init's "same
	// settings" check). Go's runtime in a shared library sees only the
	// environment the process started with, not later setenv calls, so a
	// host program that learns its rendezvous late (through torch's store)
	// hands it over here.
	env string
}

// lookup reads the rank environment with st's overrides first.
func (st settings) lookup(name string) (string, bool) {
	for _, kv := range strings.Split(st.env, "\n") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return os.LookupEnv(name)
}

// boolSetting reads a 0|1 (or false|true) setting of a "key=value"
// string; what names the string in the error ("config", "executor config").
func boolSetting(what, k, v string) (bool, error) {
	switch v {
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return false, fmt.Errorf("%w: %s %s=%q: want 0 or 1", errInvalid, what, k, v)
}

// parseSettings reads "key=value key=value"; an unknown key or bad value is
// an error naming it.
func parseSettings(s string) (settings, error) {
	var st settings
	var env []string
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return st, fmt.Errorf("%w: config %q: want key=value", errInvalid, f)
		}
		flag := func() (bool, error) { return boolSetting("config", k, v) }
		var err error
		switch {
		case strings.HasPrefix(k, "env."):
			if name := strings.TrimPrefix(k, "env."); name == "" || strings.ContainsAny(name, "=\n") {
				return st, fmt.Errorf("%w: config %q: want env.NAME=VALUE", errInvalid, f)
			}
			env = append(env, strings.TrimPrefix(f, "env."))
			continue
		}
		switch k {
		case "deterministic":
			st.deterministic, err = flag()
		case "tcp":
			st.forceTCP, err = flag()
		case "timeout_ms":
			st.timeoutMs, err = strconv.ParseInt(v, 10, 64)
			if err != nil || st.timeoutMs < 0 {
				err = fmt.Errorf("%w: config timeout_ms=%q: want a whole number of milliseconds ≥ 0", errInvalid, v)
			}
		case "connect_timeout_ms":
			st.connectMs, err = strconv.ParseInt(v, 10, 64)
			if err != nil || st.connectMs < 0 {
				err = fmt.Errorf("%w: config connect_timeout_ms=%q: want a whole number of milliseconds ≥ 0", errInvalid, v)
			}
		default:
			err = fmt.Errorf("%w: config: unknown key %q (known: deterministic, timeout_ms, connect_timeout_ms, tcp, env.NAME)", errInvalid, k)
		}
		if err != nil {
			return st, err
		}
	}
	sort.Strings(env)
	st.env = strings.Join(env, "\n")
	return st, nil
}

// session is one rank's membership: the rank start-up shared with gorun's Go
// programs (rank.Init: environment → data-plane listener → rendezvous →
// world communicator), and the settings it was made with.
type session struct {
	st settings
	r  *rank.Rank
	// leaveSched undoes joinSchedGroup (a no-op if it joined nothing).
	leaveSched func()
	// trace is the world's traced communicators (GORUN_TRACE), nil when
	// not traced; groups counts the groups made, to name their tracks.
	// Both under reg.mu.
	trace  *traceSet
	groups int
}

// joinSchedGroup puts this rank into its job's scheduling group when the
// launcher left it alone in one (comm.JoinSchedGroup). gorun starts the
// ranks of programs on its runtime in one session on a crowded host, so
// that their shared-memory waiters can hand each other the core; a program
// that loads the runtime as this library (Python with the torch backend)
// is no Go program to the launcher, and its ranks get sessions of their
// own, each its own autogroup: 4 torch ranks on 2 cores measured 3-4x
// slower small all-reduces and 0.6-0.8 of the speed at 2-16 MiB than with
// `gorun --session shared` (notes/torch-backend.md). An explicit
// GORUN_SESSION (--session own or shared) is the user's choice and is
// kept. Where a move is not possible (not root, no cgroup v1 cpu
// hierarchy), local rank 0 says so once on stderr, with the flag that
// gets the speed anyway.
func joinSchedGroup(lookup func(string) (string, bool)) func() {
	noop := func() {}
	if v, _ := lookup(rankenv.Session); v != "" && v != "auto" {
		return noop
	}
	job, _ := lookup(rankenv.JobID)
	if job == "" {
		return noop // not started by gorun (torchrun, srun): sessions are theirs
	}
	local := 0
	for _, name := range []string{rankenv.GorunLocalSize, rankenv.LocalWorldSize} {
		if v, ok := lookup(name); ok {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				local = n
				break
			}
		}
	}
	if !ownSession(job, lookup) {
		return noop // its session holds the job's other ranks: one group already
	}
	_, leave, err := comm.JoinSchedGroup(job, local)
	if err != nil {
		if lr, _ := lookup(rankenv.GorunLocalRank); lr == "0" {
			fmt.Fprintf(os.Stderr, "libgorun: %d ranks on this host's CPUs are in sessions of their own and could not "+
				"share a scheduling group (%v); `gorun --session shared` makes them share one\n", local, err)
		}
		return noop
	}
	return leave
}

// ownSession reports whether gorun gave this rank a session of its own:
// it leads its session, or the session's leader is a wrapper of this same
// rank (a shell script that runs python3, perf, strace), which gorun
// started with this rank's environment. When gorun shares one session
// among a host's ranks (--session shared, or programs on its runtime) the
// leader is gorun's supervisor, whose environment names no rank of this
// job. A leader outside this PID namespace (session id 0) or whose
// environment cannot be read is not taken for this rank's own.
func ownSession(job string, lookup func(string) (string, bool)) bool {
	sid, err := unix.Getsid(0)
	if err != nil {
		return false
	}
	rank, _ := lookup(rankenv.GorunRank)
	return sessionIsRanks(sid, os.Getpid(), func() ([]byte, error) {
		return os.ReadFile(fmt.Sprintf("/proc/%d/environ", sid))
	}, job, rank)
}

// sessionIsRanks is ownSession's judgement for a process pid in session
// sid whose leader's environment (NUL-separated) leaderEnv reads.
func sessionIsRanks(sid, pid int, leaderEnv func() ([]byte, error), job, rank string) bool {
	switch {
	case sid <= 0:
		return false
	case sid == pid:
		return true
	case rank == "":
		return false
	}
	env, err := leaderEnv()
	if err != nil {
		return false
	}
	var sameJob, sameRank bool
	for _, kv := range strings.Split(string(env), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case rankenv.JobID:
			sameJob = v == job
		case rankenv.GorunRank:
			sameRank = v == rank
		}
	}
	return sameJob && sameRank
}

// start joins the world.
func start(ctx context.Context, st settings) (*session, error) {
	leave := joinSchedGroup(st.lookup)
	opts := rank.DefaultOptions()
	opts.Comm.Deterministic = st.deterministic
	if st.timeoutMs > 0 {
		// timeout_ms: a call that has run this long fails its
		// communicator on every rank, by comm's watchdog (which checks a
		// waiting call first after DesyncCheckAfter, so that may not be
		// longer).
		t := time.Duration(st.timeoutMs) * time.Millisecond
		opts.Comm.StallTimeout = t
		if opts.Comm.DesyncCheckAfter <= 0 || opts.Comm.DesyncCheckAfter > t {
			opts.Comm.DesyncCheckAfter = t
		}
	}
	if st.connectMs > 0 {
		opts.Comm.ConnectTimeout = time.Duration(st.connectMs) * time.Millisecond
	}
	opts.Endpoint.ForceTCP = st.forceTCP
	opts.Lookup = st.lookup
	r, err := rank.Init(ctx, opts)
	if err != nil {
		leave()
		return nil, err
	}
	return &session{st: st, r: r, leaveSched: leave}, nil
}

// world is the world communicator.
func (s *session) world() *comm.Comm { return s.r.Comm() }

// newComm connects a communicator over the given world ranks.
func (s *session) newComm(ctx context.Context, ranks []int, tag string) (*comm.Comm, error) {
	g, err := s.r.Group(ranks)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	return s.r.NewComm(ctx, g, tag)
}

// close undoes start: every communicator (newest first), the world, the
// endpoint.
func (s *session) close() error {
	err := s.r.Close()
	s.leaveSched()
	return err
}
