package commtest

import (
	"fmt"
	"sync"

	"github.com/gorun-hpc/gorun/comm"
)

// StaticGroup is a comm.Group over a fixed address list, for tests and for
// programs started without a rendezvous. Safe for concurrent use.
type StaticGroup struct {
	me    int
	addrs []string
	hosts []string

	mu     sync.Mutex
	failed chan struct{}
	err    error // guarded by mu; set once, before failed is closed
}

var _ comm.Group = (*StaticGroup)(nil)

// NewStaticGroup returns rank me of the group whose members advertised
// addrs. hosts may be nil, in which case the host of each member is the host
// part of its address.
func NewStaticGroup(me int, addrs, hosts []string) *StaticGroup {
	if hosts == nil {
		hosts = make([]string, len(addrs))
		for i, a := range addrs {
			hosts[i] = hostOf(a)
		}
	}
	return &StaticGroup{me: me, addrs: addrs, hosts: hosts, failed: make(chan struct{})}
}

func hostOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[:i]
		}
	}
	return addr
}

func (g *StaticGroup) Rank() int               { return g.me }
func (g *StaticGroup) Size() int               { return len(g.addrs) }
func (g *StaticGroup) GlobalRank(r int) int    { return r }
func (g *StaticGroup) Host(r int) string       { return g.hosts[r] }
func (g *StaticGroup) DataAddr(r int) string   { return g.addrs[r] }
func (g *StaticGroup) Failed() <-chan struct{} { return g.failed }

func (g *StaticGroup) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Fail reports member r as lost, as the rendezvous would. Idempotent.
func (g *StaticGroup) Fail(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	g.err = fmt.Errorf("rank %d on %s lost", r, g.hosts[r])
	close(g.failed)
}
