//go:build cgo

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rankenv"
	"github.com/gorun-hpc/gorun/rendezvous"
)

// settings are gorun_init's config string, parsed.
type settings struct {
	deterministic bool
	timeoutMs     int64
	forceTCP      bool
}

// parseSettings reads "key=value key=value"; an unknown key or bad value is
// an error naming it.
func parseSettings(s string) (settings, error) {
	var st settings
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return st, fmt.Errorf("%w: config %q: want key=value", errInvalid, f)
		}
		flag := func() (bool, error) {
			switch v {
			case "1", "true":
				return true, nil
			case "0", "false":
				return false, nil
			}
			return false, fmt.Errorf("%w: config %s=%q: want 0 or 1", errInvalid, k, v)
		}
		var err error
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
		default:
			err = fmt.Errorf("%w: config: unknown key %q (known: deterministic, timeout_ms, tcp)", errInvalid, k)
		}
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

// session is one rank's membership: the world communicator and what
// subgroups are made from.
type session struct {
	st    settings
	ccfg  comm.Config
	ep    *comm.Endpoint
	world *comm.Comm
	// group returns the membership of the given world ranks.
	group func(ranks []int) (comm.Group, error)
	// close leaves the world (after every communicator is closed).
	close func() error
}

// launched reports whether a launcher gave this process a rank.
func launched() bool {
	for _, v := range []string{rankenv.GorunRank, rankenv.Rank, "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			return true
		}
	}
	return false
}

// start joins the world: the same steps as gorun's Go rank programs
// (environment → data-plane listener → rendezvous → world communicator).
func start(ctx context.Context, st settings) (*session, error) {
	s := &session{st: st, ccfg: comm.DefaultConfig()}
	s.ccfg.Deterministic = st.deterministic
	if !launched() {
		ep, err := comm.Listen(comm.EndpointConfig{Addr: "127.0.0.1:0", Secret: []byte("gorun-solo-rank"), ForceTCP: st.forceTCP})
		if err != nil {
			return nil, err
		}
		g := soloGroup{addr: ep.Addr()}
		s.ep = ep
		s.group = func(ranks []int) (comm.Group, error) {
			if len(ranks) != 1 || ranks[0] != 0 {
				return nil, fmt.Errorf("%w: group %v in a world of 1", errInvalid, ranks)
			}
			return g, nil
		}
		s.close = ep.Close
		c, err := comm.New(ctx, g, ep, s.ccfg)
		if err != nil {
			_ = ep.Close()
			return nil, err
		}
		s.world = c
		return s, nil
	}
	rc, err := rendezvous.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	ep, err := comm.Listen(comm.EndpointConfig{Addr: dataListenAddr(rc.Seed), Secret: rc.Secret, ForceTCP: st.forceTCP})
	if err != nil {
		return nil, err
	}
	rc.DataAddr = ep.Addr()
	w, err := rendezvous.Join(ctx, rc)
	if err != nil {
		_ = ep.Close()
		return nil, err
	}
	c, err := comm.New(ctx, w, ep, s.ccfg)
	if err != nil {
		_ = w.Close()
		_ = ep.Close()
		return nil, err
	}
	s.ep, s.world = ep, c
	s.group = func(ranks []int) (comm.Group, error) { return w.Group(ranks) }
	s.close = func() error { return errors.Join(w.Close(), ep.Close()) }
	return s, nil
}

// dataListenAddr listens on the interface that routes to the rendezvous seed
// (a UDP "connect" sends nothing), so a job on loopback stays on loopback.
func dataListenAddr(seed string) string {
	if seed == "" {
		return "127.0.0.1:0"
	}
	c, err := net.Dial("udp", seed)
	if err != nil {
		return ":0"
	}
	defer c.Close()
	host, _, _ := net.SplitHostPort(c.LocalAddr().String())
	return net.JoinHostPort(host, "0")
}

// soloGroup is the one-member world of a process started without a launcher.
type soloGroup struct{ addr string }

var _ comm.Group = soloGroup{}

func (soloGroup) Rank() int               { return 0 }
func (soloGroup) Size() int               { return 1 }
func (soloGroup) GlobalRank(r int) int    { return r }
func (soloGroup) Host(int) string         { h, _ := os.Hostname(); return h }
func (g soloGroup) DataAddr(int) string   { return g.addr }
func (soloGroup) Failed() <-chan struct{} { return nil }
func (soloGroup) Err() error              { return nil }
