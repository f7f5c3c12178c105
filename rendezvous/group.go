package rendezvous

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
)

// Undefined as a Split color leaves the caller out of every group (Split
// returns a nil group), like MPI_UNDEFINED.
const Undefined = -1

// Group is a process group: an ordered subset of the world's ranks with its
// own rank numbering. It satisfies the collective layer's Group interface.
// Methods are safe for concurrent use, except that collectives on one group
// (Barrier, Split) are serialised and must be called in the same order by
// every member.
type Group struct {
	w *World
	// ranks maps group rank → world rank, pos world rank → group rank;
	// both nil for the whole world (the identity): a list and a map of N
	// entries in each of N ranks were most of a large world's memory in
	// one process. n is the group's size.
	ranks []int
	pos   map[int]int
	n     int
	rank  int // the caller's group rank
	// key identifies the member list on the wire: groups with the same
	// members in the same order share collective sequence numbers, so their
	// messages cannot be confused with another group's.
	key uint64

	// opMu serialises this group's collectives (their sequence numbers must
	// follow call order).
	opMu sync.Mutex

	// failed is closed, and err set, under World.mu when a member is lost.
	// pending holds the loss from the moment it is known until it is
	// published (World.publishLocked): the first loss wins either way.
	failed  chan struct{}
	err     error
	pending error
	// left is closed, and leaver set, under World.mu when a member leaves
	// gracefully: no collective can complete on the group after that, but
	// one in progress may (the leaver may have done its part first).
	left   chan struct{}
	leaver *LeftError
}

// position returns world rank r's group rank, and whether r is in g.
func (g *Group) position(r int) (int, bool) {
	if g.pos == nil {
		return r, r >= 0 && r < g.n
	}
	i, ok := g.pos[r]
	return i, ok
}

// worldRank maps group rank i to its world rank.
func (g *Group) worldRank(i int) int {
	if g.ranks == nil {
		return i
	}
	return g.ranks[i]
}

// newGroupLocked builds and registers a group; the caller holds w.mu (or is
// building the World). nil ranks is the whole world.
func (w *World) newGroupLocked(ranks []int) *Group {
	g := &Group{
		w: w, ranks: ranks, rank: -1, n: len(ranks),
		failed: make(chan struct{}), left: make(chan struct{}),
	}
	identity := len(ranks) == w.cfg.WorldSize
	for i, r := range ranks {
		identity = identity && r == i
	}
	if ranks == nil || identity {
		g.ranks, g.n = nil, w.cfg.WorldSize
	} else {
		g.pos = make(map[int]int, len(ranks))
	}
	h := fnv.New64a()
	var b [binary.MaxVarintLen64]byte
	for i := range g.n {
		r := g.worldRank(i)
		if g.pos != nil {
			g.pos[r] = i
		}
		if r == w.cfg.Rank {
			g.rank = i
		}
		h.Write(b[:binary.PutUvarint(b[:], uint64(r))])
	}
	g.key = h.Sum64()
	// A group made after one of its members was lost starts failed, so
	// nobody waits on a member that will never answer.
	for i := range g.n {
		r := g.worldRank(i)
		switch m := &w.members[r]; {
		case m.status == statusDead && g.err == nil:
			g.err = &LostError{Rank: r, Host: m.host, Epoch: w.epoch, Cause: ErrDeclaredDead}
			close(g.failed)
		case m.status == statusLeft && g.leaver == nil:
			g.leaver = &LeftError{Rank: r, Host: m.host}
			close(g.left)
		}
	}
	w.groups = append(w.groups, g)
	return g
}

// Rank returns the caller's rank in the group.
func (g *Group) Rank() int { return g.rank }

// Size returns the number of members.
func (g *Group) Size() int { return g.n }

// GlobalRank maps a group rank to a world rank.
func (g *Group) GlobalRank(r int) int { return g.worldRank(r) }

// Ranks returns the world ranks of the members in group order.
func (g *Group) Ranks() []int {
	if g.ranks == nil {
		out := make([]int, g.n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	return slices.Clone(g.ranks)
}

// Host returns the host group rank r advertised.
func (g *Group) Host(r int) string {
	g.w.mu.Lock()
	defer g.w.mu.Unlock()
	return g.w.members[g.worldRank(r)].host
}

// DataAddr returns the data-plane address group rank r advertised.
func (g *Group) DataAddr(r int) string {
	g.w.mu.Lock()
	defer g.w.mu.Unlock()
	return g.w.members[g.worldRank(r)].dataAddr
}

// Failed is closed when a member of the group is lost; never on a graceful
// leave.
func (g *Group) Failed() <-chan struct{} { return g.failed }

// Err is nil until Failed is closed; then the *LostError naming the first
// member lost.
func (g *Group) Err() error {
	g.w.mu.Lock()
	defer g.w.mu.Unlock()
	return g.err
}

// Barrier blocks until every member of the group has called Barrier, ctx
// ends, or a member is lost (its *LostError) or left (*LeftError).
func (g *Group) Barrier(ctx context.Context) error {
	_, err := g.allgather(ctx, "barrier", nil)
	return err
}

// AllGather gives every member every member's payload, indexed by group
// rank, over the gossip layer's reliable messages (relayed by host leaders
// where there are any). It is meant for small bootstrap data, such as the
// unique id a GPU communicator's rank 0 hands to the others (nccl/), not
// for tensors. Every member must call it, in the same order as the group's
// other collectives; it fails like Barrier when a member is lost or left.
func (g *Group) AllGather(ctx context.Context, payload []byte) ([][]byte, error) {
	return g.allgather(ctx, "allgather", payload)
}

// Split partitions the group like MPI_Comm_split; see World.Split.
func (g *Group) Split(ctx context.Context, color, key int) (*Group, error) {
	if color < 0 && color != Undefined {
		return nil, fmt.Errorf("rendezvous: split: color %d is negative and not Undefined", color)
	}
	var p []byte
	p = binary.AppendVarint(p, int64(color))
	p = binary.AppendVarint(p, int64(key))
	all, err := g.allgather(ctx, "split", p)
	if err != nil {
		return nil, err
	}
	if color == Undefined {
		return nil, nil
	}
	type entry struct{ key, grank int }
	var mine []entry
	for gr, b := range all {
		c, n := binary.Varint(b)
		k, m := binary.Varint(b[max(n, 0):])
		if n <= 0 || m <= 0 {
			return nil, fmt.Errorf("rendezvous: split: malformed entry from group rank %d", gr)
		}
		if int(c) == color {
			mine = append(mine, entry{int(k), gr})
		}
	}
	// Key order, ties by rank in the parent: MPI_Comm_split's rule.
	slices.SortStableFunc(mine, func(a, b entry) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return a.grank - b.grank
	})
	ranks := make([]int, len(mine))
	for i, e := range mine {
		ranks[i] = g.worldRank(e.grank)
	}
	g.w.mu.Lock()
	defer g.w.mu.Unlock()
	return g.w.newGroupLocked(ranks), nil
}
