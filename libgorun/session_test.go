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
