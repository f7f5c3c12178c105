package launcher

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// After a desync, gorun's verdict (its last line) says "desync", quotes
// both calls, and blames no rank that issued the common call: with 3 ranks
// where ranks 1 and 2 broadcast and rank 0 all-reduces, only rank 0 may be
// named (when a comparison of every rank's calls found the sides; a
// pairwise detection knows only the two ranks it compared, and then none
// is named alone); with 4 (two and two) no single rank can be blamed.
func TestDesyncVerdictNamesTheCalls(t *testing.T) {
	for _, np := range []int{3, 4} {
		j := newJobRun(t, np, "split:0", nil)
		err := j.launch(context.Background())
		if err == nil {
			t.Fatalf("np %d: the desync job succeeded", np)
		}
		msg := err.Error()
		t.Logf("np %d: %s", np, msg)
		for _, want := range []string{"desync", "AllReduce", "Broadcast"} {
			if !strings.Contains(msg, want) {
				t.Errorf("np %d: verdict %q does not say %q", np, msg, want)
			}
		}
		// The form that blames one rank: "rank N (host H, pid P)".
		blamed := regexp.MustCompile(`rank (\d+) \(host `).FindStringSubmatch(msg)
		switch {
		case np == 3 && blamed != nil && blamed[1] != "0":
			t.Errorf("np 3: verdict %q, want rank 0 (the one that differed) blamed", msg)
		case np == 4 && blamed != nil:
			t.Errorf("np 4: verdict %q blames rank %s, but two ranks called each", msg, blamed[1])
		}
	}
}
