package plural

import "testing"

func TestNoun(t *testing.T) {
	for _, c := range []struct {
		n    int
		want string
	}{{0, "ranks"}, {1, "rank"}, {2, "ranks"}, {-1, "ranks"}, {4096, "ranks"}} {
		if got := Noun(c.n, "rank", "ranks"); got != c.want {
			t.Errorf("Noun(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	if got := Noun(3, "process", "processes"); got != "processes" {
		t.Errorf("Noun(3, process) = %q", got)
	}
}
