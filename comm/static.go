package comm

import (
	"fmt"
	"net"
	"sync"
)

// StaticGroup is a Group over a fixed member list that no rendezvous
// watches: a program that runs alone (a world of one), a group whose members
// were agreed on by some other means, or a test. It is production code (it
// does not import testing), so binaries can use it. Safe for concurrent use.
//
// Nothing reports a lost member on its own: Fail does, when the owner learns
// of a loss some other way.
type StaticGroup struct {
	me    int
	addrs []string
	hosts []string

	mu     sync.Mutex
	failed chan struct{}
	err    error // guarded by mu; set once, before failed is closed
}

var _ Group = (*StaticGroup)(nil)

// NewStaticGroup returns rank me of the group whose members advertised the
// data-plane addresses addrs (index = group rank = world rank). hosts may be
// nil, in which case the host of each member is the host part of its
// address. It panics if me is not an index of addrs or hosts has another
// length: both are programming errors, not input.
func NewStaticGroup(me int, addrs, hosts []string) *StaticGroup {
	if me < 0 || me >= len(addrs) {
		panic(fmt.Sprintf("comm: NewStaticGroup: rank %d of %d", me, len(addrs)))
	}
	if hosts == nil {
		hosts = make([]string, len(addrs))
		for i, a := range addrs {
			hosts[i] = hostOf(a)
		}
	}
	if len(hosts) != len(addrs) {
		panic(fmt.Sprintf("comm: NewStaticGroup: %d hosts for %d addresses", len(hosts), len(addrs)))
	}
	return &StaticGroup{me: me, addrs: addrs, hosts: hosts, failed: make(chan struct{})}
}

// hostOf is the host part of host:port, or the whole string when it has no
// port (in-memory test addresses need not be real ones).
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// Rank is the caller's rank. Size is the number of members.
func (g *StaticGroup) Rank() int { return g.me }

// Size is the number of members.
func (g *StaticGroup) Size() int { return len(g.addrs) }

// GlobalRank is the identity: a static group is its own world.
func (g *StaticGroup) GlobalRank(r int) int { return r }

// Host returns member r's host label.
func (g *StaticGroup) Host(r int) string { return g.hosts[r] }

// DataAddr returns member r's data-plane address.
func (g *StaticGroup) DataAddr(r int) string { return g.addrs[r] }

// Failed is closed once Fail has been called.
func (g *StaticGroup) Failed() <-chan struct{} { return g.failed }

// Err is nil until Fail is called, then the error naming the lost member.
func (g *StaticGroup) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Fail reports member r as lost, as a rendezvous would. Only the first call
// counts.
func (g *StaticGroup) Fail(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	g.err = fmt.Errorf("rank %d on %s lost", r, g.hosts[r])
	close(g.failed)
}
