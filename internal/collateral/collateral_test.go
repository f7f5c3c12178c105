package collateral

import (
	"strings"
	"testing"
)

// A report survives the round trip, and a long one is cut to fit one
// atomic pipe write instead of being split between writers' lines.
func TestEncodeDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Report
	}{
		{"short", Report{Rank: 2, Blame: 3, Why: "comm: rank 3: connection closed"}},
		{"unknown blame", Report{Rank: 0, Blame: -1, Why: "comm: peer lost"}},
		{"long", Report{Rank: 5, Blame: 1, Why: strings.Repeat("x\"", 10000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Encode(tc.in)
			if len(b) > maxLine || b[len(b)-1] != '\n' || strings.Count(string(b), "\n") != 1 {
				t.Fatalf("line of %d bytes, want one line within %d", len(b), maxLine)
			}
			got, ok := Decode(b[:len(b)-1])
			if !ok || got.Rank != tc.in.Rank || got.Blame != tc.in.Blame || !strings.HasPrefix(tc.in.Why, got.Why) {
				t.Fatalf("decoded %+v, %v from %+v", got, ok, tc.in)
			}
		})
	}
	for _, bad := range []string{"", "garbage", `{"rank":-1}`} {
		if _, ok := Decode([]byte(bad)); ok {
			t.Errorf("Decode(%q) accepted", bad)
		}
	}
}

// Step lines and reports share the pipe: each decoder takes its own kind
// and refuses the other, so a step line is never read as a collateral
// failure (which would blame a healthy rank).
func TestStepLines(t *testing.T) {
	for _, s := range []Step{{Rank: 0, Step: 1}, {Rank: 7, Step: 123456789012}} {
		b := EncodeStep(s)
		if b[len(b)-1] != '\n' || strings.Count(string(b), "\n") != 1 {
			t.Fatalf("EncodeStep(%+v) = %q, want one line", s, b)
		}
		got, ok := DecodeStep(b[:len(b)-1])
		if !ok || got != s {
			t.Fatalf("DecodeStep(%q) = %+v, %v", b, got, ok)
		}
		if r, ok := Decode(b[:len(b)-1]); ok {
			t.Fatalf("Decode took the step line %q as report %+v", b, r)
		}
	}
	rep := Encode(Report{Rank: 1, Blame: 2, Why: "comm: peer lost"})
	if s, ok := DecodeStep(rep[:len(rep)-1]); ok {
		t.Fatalf("DecodeStep took the report %q as %+v", rep, s)
	}
	for _, bad := range []string{"", "x", `{"rank":1}`, `{"step":3}`, `{"rank":-1,"step":3}`, `{"rank":1,"step":-3}`} {
		if s, ok := DecodeStep([]byte(bad)); ok {
			t.Errorf("DecodeStep(%q) = %+v, accepted", bad, s)
		}
	}
}
