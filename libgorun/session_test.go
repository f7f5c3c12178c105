//go:build cgo

package main

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSettings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want settings
		err  string // substring of the error; "" for none
	}{
		{in: "", want: settings{}},
		{in: "deterministic=1 tcp=true timeout_ms=250", want: settings{deterministic: true, forceTCP: true, timeoutMs: 250}},
		{in: "env.B=2 env.A=x:1", want: settings{env: "A=x:1\nB=2"}},
		{in: "deterministic=maybe", err: `deterministic="maybe"`},
		{in: "timeout_ms=-5", err: "timeout_ms"},
		{in: "connect_timeout_ms=1500", want: settings{connectMs: 1500}},
		{in: "connect_timeout_ms=soon", err: "connect_timeout_ms"},
		{in: "speed=11", err: `unknown key "speed"`},
		{in: "novalue", err: "want key=value"},
		{in: "env.=1", err: "env.NAME=VALUE"},
	} {
		got, err := parseSettings(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errInvalid) {
				t.Errorf("parseSettings(%q) = %v, want an invalid-argument error containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseSettings(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	st, _ := parseSettings("env.GORUN_TEST_ONLY_VAR=7")
	if v, ok := st.lookup("GORUN_TEST_ONLY_VAR"); !ok || v != "7" {
		t.Errorf("lookup of an override = %q %v", v, ok)
	}
	if _, ok := st.lookup("GORUN_TEST_SURELY_UNSET_VAR"); ok {
		t.Error("lookup invented a variable")
	}
}

// A rank has a session of its own when it leads it, or when its leader is
// a wrapper of the same rank of the same job (gorun started the wrapper
// with the rank's environment); not when the leader is gorun's supervisor
// (a shared session), a rank of an outer job (gorun run from a rank), or
// unknown.
func TestSessionIsRanks(t *testing.T) {
	env := func(kv ...string) func() ([]byte, error) {
		return func() ([]byte, error) { return []byte(strings.Join(kv, "\x00") + "\x00"), nil }
	}
	unreadable := func() ([]byte, error) { return nil, errors.New("permission denied") }
	for _, tc := range []struct {
		name     string
		sid, pid int
		leader   func() ([]byte, error)
		rank     string
		want     bool
	}{
		{"leads its session", 40, 40, unreadable, "2", true},
		{"wrapper of this rank", 39, 40, env("PATH=/bin", "GORUN_JOB_ID=j1", "GORUN_RANK=2"), "2", true},
		{"supervisor (shared session)", 30, 40, env("PATH=/bin", "GORUN_JOB_ID=j1"), "2", false},
		{"another rank's process", 39, 40, env("GORUN_JOB_ID=j1", "GORUN_RANK=3"), "2", false},
		{"outer job's rank", 39, 40, env("GORUN_JOB_ID=outer", "GORUN_RANK=2"), "2", false},
		{"leader outside the PID namespace", 0, 40, env("GORUN_JOB_ID=j1", "GORUN_RANK=2"), "2", false},
		{"leader unreadable", 39, 40, unreadable, "2", false},
		{"no rank of its own", 39, 40, env("GORUN_JOB_ID=j1", "GORUN_RANK="), "", false},
	} {
		if got := sessionIsRanks(tc.sid, tc.pid, tc.leader, "j1", tc.rank); got != tc.want {
			t.Errorf("%s: sessionIsRanks = %v, want %v", tc.name, got, tc.want)
		}
	}
}
