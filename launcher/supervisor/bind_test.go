package supervisor

import (
	"testing"
)

func TestBindPolicyAndParse(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, BindAuto},
		{[]string{"A=1", "GORUN_BIND=none"}, BindNone},
		{[]string{"GORUN_BIND=none", "GORUN_BIND=auto"}, BindAuto}, // the last wins, as in exec
		{[]string{"GORUN_BINDX=none"}, BindAuto},
	} {
		if got := bindPolicy(tc.env); got != tc.want {
			t.Errorf("bindPolicy(%q) = %q, want %q", tc.env, got, tc.want)
		}
	}
	for in, want := range map[string]string{"": BindAuto, "auto": BindAuto, "none": BindNone, "core": ""} {
		got, err := ParseBind(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("ParseBind(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestOwnSessionAndParse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		crowded   bool
		env       []string
		onRuntime bool
		want      bool
	}{
		{"a CPU each", false, []string{"GORUN_SESSION=shared"}, true, true},
		{"crowded, gorun's runtime", true, nil, true, false},
		{"crowded, another program", true, nil, false, true},
		{"crowded, another program, shared", true, []string{"GORUN_SESSION=shared"}, false, false},
		{"crowded, gorun's runtime, own", true, []string{"GORUN_SESSION=own"}, true, true},
		{"crowded, shared, then auto", true, []string{"GORUN_SESSION=shared", "GORUN_SESSION=auto"}, false, true},
		{"crowded, --bind-to none", true, []string{"GORUN_BIND=none"}, true, true},
		{"crowded, --bind-to none, shared", true, []string{"GORUN_BIND=none", "GORUN_SESSION=shared"}, false, false},
		{"crowded, unknown value", true, []string{"GORUN_SESSION=bogus"}, true, false},
	} {
		asked := false
		got := ownSession(tc.crowded, tc.env, func() bool { asked = true; return tc.onRuntime })
		if got != tc.want {
			t.Errorf("%s: ownSession = %v, want %v", tc.name, got, tc.want)
		}
		if asked && !tc.crowded {
			t.Errorf("%s: read the program's build info for a rank with a CPU of its own", tc.name)
		}
	}
	for in, want := range map[string]string{"": SessionAuto, "auto": SessionAuto, "shared": SessionShared, "own": SessionOwn, "none": ""} {
		got, err := ParseSession(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("ParseSession(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
