package fault

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseChaosFaults(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		check  func(f Fault) bool
		refuse string
	}{
		{spec: "slow:rank=1:at=1s:for=5s:duty=0.5", check: func(f Fault) bool {
			return f.Kind == Slow && f.Rank == 1 && f.For == 5*time.Second && f.Duty == 0.5 && f.Period == 0
		}},
		{spec: "slow:rank=0:at=0s:period=300ms", check: func(f Fault) bool { return f.Period == 300*time.Millisecond }},
		{spec: "drop:rank=1:peer=2:at=1s", check: func(f Fault) bool {
			return f.Kind == "drop" && f.Net != nil && f.Net.Peer == 2 && f.At == time.Second
		}},
		{spec: "partition:ranks=0-1:at=1s:for=3s", check: func(f Fault) bool {
			return f.Kind == "partition" && f.Net != nil && len(f.Net.Ranks) == 2 && f.For == 3*time.Second
		}},
		{spec: "slow:rank=1:at=1s:duty=1", refuse: "duty=1: must be between 0 and 1"},
		{spec: "slow:rank=1:at=1s:period=10ms", refuse: "period=10ms: must be at least 100ms"},
		{spec: "slow:rank=1:at=1s:ms=4", refuse: `key "ms" does not apply to slow`},
		{spec: "delay:rank=1:at=1s", refuse: "delay needs ms="},
		{spec: "partition:ranks=x:at=1s", refuse: `ranks=x: "x": not a whole number`},
		{spec: "corrupt:rank=1:after-steps=5", check: func(f Fault) bool {
			return f.Net != nil && f.AfterSteps == 5 && f.Net.AfterSteps == 5 && f.At == 0
		}},
		{spec: "partition:hosts=h2,h3:after-steps=3:for=2s", check: func(f Fault) bool {
			return f.Net != nil && strings.Join(f.Net.Hosts, ",") == "h2,h3" && f.AfterSteps == 3
		}},
		{spec: "drop:rank=1:at=1s:after-steps=2", refuse: "at= and after-steps= both given"},
		{spec: "partition:ranks=0:hosts=h2:at=1s", refuse: "ranks= and hosts= both given"},
		{spec: "partition:after-steps=2", refuse: "partition needs ranks= or hosts="},
	} {
		f, err := Parse(tc.spec)
		if tc.refuse != "" {
			var se *SpecError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.refuse) || !strings.Contains(err.Error(), tc.spec) {
				t.Errorf("Parse(%q) = %v, want a refusal saying %q", tc.spec, err, tc.refuse)
			}
			continue
		}
		if err != nil || !tc.check(f) {
			t.Errorf("Parse(%q) = %+v, %v", tc.spec, f, err)
		}
	}
}
