package ft

import (
	"sync"

	"github.com/gorun-hpc/gorun/comm"
)

// group is one quorum's membership as a comm.Group: group rank i is
// Participants[i], its world rank the replica id. It fails when the
// service says the quorum failed (a participant died or gave up), which
// is how a survivor blocked in a collective learns of a death within
// milliseconds.
type group struct {
	id     int64
	me     int
	parts  []Participant
	failed chan struct{}
	once   sync.Once
	err    error // set once, before failed is closed
}

var _ comm.Group = (*group)(nil)

func newGroup(id int64, me int, parts []Participant) *group {
	return &group{id: id, me: me, parts: parts, failed: make(chan struct{})}
}

func (g *group) Rank() int               { return g.me }
func (g *group) Size() int               { return len(g.parts) }
func (g *group) GlobalRank(r int) int    { return g.parts[r].Replica }
func (g *group) Host(r int) string       { return g.parts[r].Host }
func (g *group) DataAddr(r int) string   { return g.parts[r].Addr }
func (g *group) Failed() <-chan struct{} { return g.failed }

func (g *group) Err() error {
	select {
	case <-g.failed:
		return g.err
	default:
		return nil
	}
}

// fail fails the group with err; the first call wins.
func (g *group) fail(err error) {
	g.once.Do(func() {
		g.err = err
		close(g.failed)
	})
}
