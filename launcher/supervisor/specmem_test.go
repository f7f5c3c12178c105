package supervisor

import (
	"slices"
	"strconv"
	"testing"
	"unsafe"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Equal strings of different ranks end up as one string (one backing
// array), and no value changes.
func TestShareRankStrings(t *testing.T) {
	var ranks, want []wire.SupervisorRank
	for r := range 3 {
		// Built afresh per rank, as JSON decoding does.
		env := []string{"PATH=" + string([]byte("/usr/bin")), "RANK=" + strconv.Itoa(r)}
		ranks = append(ranks, wire.SupervisorRank{Rank: r, Path: string([]byte("/bin/prog")), Argv: []string{string([]byte("prog")), "-x"}, Env: env})
		want = append(want, wire.SupervisorRank{Rank: r, Path: "/bin/prog", Argv: []string{"prog", "-x"}, Env: slices.Clone(env)})
	}
	shareRankStrings(ranks)
	for r := range ranks {
		if !slices.Equal(ranks[r].Env, want[r].Env) || !slices.Equal(ranks[r].Argv, want[r].Argv) || ranks[r].Path != want[r].Path {
			t.Fatalf("rank %d changed: %+v, want %+v", r, ranks[r], want[r])
		}
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	if !same(ranks[0].Env[0], ranks[2].Env[0]) || !same(ranks[0].Argv[0], ranks[1].Argv[0]) || !same(ranks[0].Path, ranks[2].Path) {
		t.Error("equal strings of two ranks are still two copies")
	}
	if same(ranks[0].Env[1], ranks[1].Env[1]) {
		t.Error("two ranks' different values share one string")
	}
}
