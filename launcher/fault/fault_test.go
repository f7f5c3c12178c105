package fault

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Fault
	}{
		{"kill:rank=2:at=2s", Fault{Kind: Kill, Rank: 2, At: 2 * time.Second, Signal: syscall.SIGKILL}},
		{"kill:rank=0:at=0s:sig=TERM", Fault{Kind: Kill, At: 0, Signal: syscall.SIGTERM}},
		{"kill:at=150ms:rank=3:sig=SIGUSR1", Fault{Kind: Kill, Rank: 3, At: 150 * time.Millisecond, Signal: syscall.SIGUSR1}},
		{"kill:rank=1:at=1s:sig=9", Fault{Kind: Kill, Rank: 1, At: time.Second, Signal: syscall.SIGKILL}},
		{"stop:rank=1:at=1s:for=5s", Fault{Kind: Stop, Rank: 1, At: time.Second, For: 5 * time.Second, Signal: syscall.SIGKILL}},
		{"stop:rank=1:at=1s", Fault{Kind: Stop, Rank: 1, At: time.Second, Signal: syscall.SIGKILL}},
		{"cont:rank=1:at=6s", Fault{Kind: Cont, Rank: 1, At: 6 * time.Second, Signal: syscall.SIGKILL}},
		{"kill-host:host=h2:at=3s", Fault{Kind: KillHost, Host: "h2", At: 3 * time.Second, Signal: syscall.SIGKILL}},
		{"random:mtbf=10s:seed=7", Fault{Kind: Random, MTBF: 10 * time.Second, Seed: 7, Signal: syscall.SIGKILL}},
		{"kill:rank=1:after-steps=5", Fault{Kind: Kill, Rank: 1, AfterSteps: 5, Signal: syscall.SIGKILL}},
		{"stop:rank=0:after-steps=2:for=1s", Fault{Kind: Stop, AfterSteps: 2, For: time.Second, Signal: syscall.SIGKILL}},
		{"kill-host:host=h2:after-steps=7", Fault{Kind: KillHost, Host: "h2", AfterSteps: 7, Signal: syscall.SIGKILL}},
	} {
		got, err := Parse(tc.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.spec, err)
			continue
		}
		tc.want.Spec = tc.spec
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q) = %+v, want %+v", tc.spec, got, tc.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ spec, why string }{
		{"", `unknown kind ""`},
		{"explode:rank=1:at=1s", `unknown kind "explode"`},
		{"kill:rank=2", "kill needs at= or after-steps="},
		{"kill:rank=1:at=1s:after-steps=5", "at= and after-steps= both given"},
		{"kill:rank=1:after-steps=0", "after-steps=0: must be at least 1"},
		{"kill:rank=1:after-steps=x", "after-steps=x: invalid syntax"},
		{"random:mtbf=1s:seed=1:after-steps=3", `key "after-steps" does not apply to random`},
		{"kill:at=2s", "kill needs rank="},
		{"kill-host:at=2s", "kill-host needs host="},
		{"random:mtbf=10s", "random needs seed="},
		{"kill:rank=x:at=2s", "rank=x: invalid syntax"},
		{"kill:rank=-1:at=2s", "rank=-1: must not be negative"},
		{"kill:rank=1:at=soon", "at=soon: not a duration"},
		{"kill:rank=1:at=-2s", "at=-2s: must not be negative"},
		{"kill:rank=1:at=2s:for=1s", `key "for" does not apply to kill`},
		{"stop:rank=1:at=2s:sig=TERM", `key "sig" does not apply to stop`},
		{"stop:rank=1:at=1s:for=0s", "for=0s: must be positive"},
		{"kill:rank=1:rank=2:at=1s", `key "rank" given twice`},
		{"kill:rank=1:at=1s:sig=NOPE", "sig=NOPE: no such signal"},
		{"kill:rank=1:at=1s:sig=99", "sig=99: no such signal number"},
		{"kill:rank=1:at", `field "at": expected key=value`},
		{"kill:rank=1:at=", "at= has no value"},
		{"random:mtbf=0s:seed=1", "mtbf=0s: must be at least 1ms"},
		{"random:mtbf=1s:seed=-3", "seed=-3: invalid syntax"},
	} {
		_, err := Parse(tc.spec)
		var se *SpecError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, want a *SpecError", tc.spec, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), "--inject \""+tc.spec+"\"") {
			t.Errorf("Parse(%q) error %q, want it to name the spec and say %q", tc.spec, err, tc.why)
		}
	}
}

func TestParseFile(t *testing.T) {
	fs, err := ParseFile(strings.NewReader("# chaos\n\nkill:rank=1:at=1s\n  stop:rank=0:at=2s:for=1s  \n"), "f.txt")
	if err != nil || len(fs) != 2 || fs[0].Kind != Kill || fs[1].For != time.Second {
		t.Fatalf("ParseFile = %+v, %v", fs, err)
	}
	_, err = ParseFile(strings.NewReader("kill:rank=1:at=1s\n\nkill:rank=1\n"), "f.txt")
	if err == nil || !strings.Contains(err.Error(), "(f.txt:3)") {
		t.Fatalf("a bad third line: %v, want it named f.txt:3", err)
	}
}
