package rendezvous

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// formedMember is a gossip member that behaves as a rank whose own world
// has formed: it answers probes and push-pulls and refutes what it hears
// about itself, but pulls no tables any more. A World cannot be held in
// that state while others still form, so the test runs memberlist with
// the rank's metadata itself.
type formedMember struct{ meta []byte }

func (d formedMember) NodeMeta(int) []byte                  { return d.meta }
func (formedMember) NotifyMsg([]byte)                       {}
func (formedMember) GetBroadcasts(int, int) [][]byte        { return nil }
func (formedMember) LocalState(bool) []byte                 { return nil }
func (formedMember) MergeRemoteState(buf []byte, join bool) {}

// A member that gossip declared dead before the world formed, while it
// could not hear it (starved past memberlist's gossip to the dead; here
// cut off for 6 s), and whose own world has formed, so that it pulls no
// more, is waited for by the others: they pull from it until it has
// refuted. Before, nothing ever told it, and formation timed out with it
// missing in every other view (4,096 ranks in one process).
func TestHeldDeadMemberIsPulled(t *testing.T) {
	bubble(t, func(t *testing.T) {
		nw := &rendezvoustest.Network{}
		const size, x = 4, 2 // rank 3 never starts: nobody forms
		cfgs := make([]Config, 2)
		for r := range cfgs {
			cfgs[r] = memConfig(t, nw, "held", r, size)
			cfgs[r].FormationTimeout = time.Minute
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make([]error, len(cfgs))
		for r := range cfgs {
			wg.Go(func() {
				w, err := Join(ctx, cfgs[r])
				if w != nil {
					_ = w.Close()
				}
				errs[r] = err
			})
		}
		xc := memConfig(t, nw, "held", x, size)
		mc := xc.memberlistConfig()
		mc.Delegate = formedMember{meta: encodeMeta(xc.meta())}
		mc.Transport = xc.Transport
		mc.Logger = newMemberlistLogger(xc.Logger)
		key, err := gossipKey(xc.Secret, xc.JobID)
		if err != nil {
			t.Fatal(err)
		}
		mc.SecretKey = key
		ml, err := memberlist.Create(mc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ml.Join([]string{xc.Seed}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		nw.Isolate(memAddr(x))
		time.Sleep(6 * time.Second) // declared dead, and the gossip to the dead is over
		nw.Heal(memAddr(x))
		time.Sleep(15 * time.Second)
		cancel()
		wg.Wait()
		_ = ml.Shutdown()
		for r, err := range errs {
			var fe *FormationError
			if !errors.As(err, &fe) {
				t.Fatalf("rank %d: %v, want a formation error (rank 3 never started)", r, err)
			}
			var missing []int
			for _, m := range fe.Missing {
				missing = append(missing, m.Rank)
			}
			if !slices.Equal(missing, []int{3}) {
				t.Errorf("rank %d still misses ranks %v, want only [3]: rank %d, declared dead while it could not hear it, was never brought back", r, missing, x)
			}
		}
	})
}
