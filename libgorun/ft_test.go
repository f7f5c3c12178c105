//go:build cgo

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
)

func TestParseFTSettings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ftSettings
		err  string // substring of the error; "" for none
	}{
		{in: "", want: ftSettings{}},
		{in: "dial_timeout_ms=1500 connect_timeout_ms=20 tcp=1 env.A=x:1",
			want: ftSettings{dial: 1500 * time.Millisecond, connect: 20 * time.Millisecond, tcp: true, env: map[string]string{"A": "x:1"}}},
		{in: "dial_timeout_ms=0", err: "dial_timeout_ms"},
		{in: "connect_timeout_ms=soon", err: "connect_timeout_ms"},
		{in: "tcp=maybe", err: `tcp="maybe"`},
		{in: "deterministic=1", err: `unknown key "deterministic"`},
		{in: "novalue", err: "want key=value"},
		{in: "env.=1", err: "env.NAME=VALUE"},
	} {
		got, err := parseFTSettings(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errInvalid) {
				t.Errorf("parseFTSettings(%q) = %v, want an invalid-argument error containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.dial != tc.want.dial || got.connect != tc.want.connect || got.tcp != tc.want.tcp ||
			fmt.Sprint(got.env) != fmt.Sprint(orEmpty(tc.want.env)) {
			t.Errorf("parseFTSettings(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// Each of ft's failures maps to the status gorun.h promises for it.
func TestFTErrStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("gorun_ft_quorum: %w", ft.ErrQuorumFailed), statusPeerLost},
		{fmt.Errorf("gorun_ft_allreduce: %w: %w", ft.ErrQuorumFailed, comm.ErrPeerLost), statusPeerLost},
		{ft.ErrServiceLost, statusPeerLost},
		{fmt.Errorf("x: %w: the state's load callback returned 1", ft.ErrHeal), statusAborted},
		{ft.ErrNotFaultTolerant, statusInit},
		{ft.ErrAuth, statusInit},
		{ft.ErrPhase, statusInvalid},
		{ft.ErrNoState, statusInvalid},
		{ft.ErrClosed, statusClosed},
		{fmt.Errorf("gorun_ft_should_commit: %w", context.DeadlineExceeded), statusTimeout},
	} {
		if got := int(ftErr(tc.err)); got != tc.want {
			t.Errorf("ftErr(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// A stale or unknown handle, and calls with NULL outputs, are refused with
// GORUN_ERR_INVALID before anything reaches ft.
func TestFTBadHandles(t *testing.T) {
	if rc := gorun_ft_step(12345, nil); rc != statusInvalid {
		t.Errorf("gorun_ft_step(unknown) = %d, want %d", rc, statusInvalid)
	}
	if rc := gorun_ft_close(12345); rc != statusInvalid {
		t.Errorf("gorun_ft_close(unknown) = %d, want %d", rc, statusInvalid)
	}
	if rc := gorun_ft_join(nil, nil); rc != statusInvalid {
		t.Errorf("gorun_ft_join(out NULL) = %d, want %d", rc, statusInvalid)
	}
	if rc := gorun_ft_allreduce(12345, nil, 0, 1, 5, -1); rc != statusInvalid {
		t.Errorf("gorun_ft_allreduce(unknown) = %d, want %d", rc, statusInvalid)
	}
}

// A program that gorun did not start with --fault-tolerant is told so
// (GORUN_ERR_INIT), not left waiting.
func TestFTJoinOutsideGorun(t *testing.T) {
	t.Setenv(ft.AddrEnv, "") // restored after the test
	os.Unsetenv(ft.AddrEnv)
	var h int64
	rc := gorun_ft_join(nil, (*_Ctype_gorun_ft_t)(&h))
	if rc != statusInit {
		t.Fatalf("gorun_ft_join without %s = %d, want GORUN_ERR_INIT (%d)", ft.AddrEnv, rc, statusInit)
	}
}
