package consolelog

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Lines start with the wall clock to the millisecond, in the layout gorun
// uses for its own log, and the milliseconds are real, not a second-only
// stamp padded with zeros.
func TestLineFormat(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, zerolog.InfoLevel).With().Int("rank", 3).Logger()
	seen := map[string]bool{}
	for i := range 5 {
		log.Warn().Int("i", i).Msg("hello")
		time.Sleep(3 * time.Millisecond)
	}
	log.Debug().Msg("filtered out")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5:\n%s", len(lines), b.String())
	}
	re := regexp.MustCompile(`^(\d\d:\d\d:\d\d\.(\d{3})) WRN hello i=\d rank=3$`)
	for _, l := range lines {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q does not match %v", l, re)
		}
		ts, err := time.ParseInLocation(TimeFormat, m[1], time.Local)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		ts = time.Date(now.Year(), now.Month(), now.Day(), ts.Hour(), ts.Minute(), ts.Second(), ts.Nanosecond(), time.Local)
		if d := now.Sub(ts); d < 0 || d > time.Minute {
			t.Errorf("line %q: time is %v away from now", l, d)
		}
		seen[m[2]] = true
	}
	if len(seen) < 2 {
		t.Errorf("5 lines 3 ms apart all show the same milliseconds %v: the stamp lost them", seen)
	}
}
