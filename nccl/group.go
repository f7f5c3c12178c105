package nccl

import (
	"context"
	"errors"
	"fmt"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/overlap"
)

// Group collects calls to issue as one NCCL group (ncclGroupStart …
// ncclGroupEnd): NCCL launches them together, which is how several buckets,
// or the sends and receives of an exchange, share one launch. Build it on
// one goroutine; nothing is issued until Issue.
type Group struct {
	c   *Comm
	ls  []launch
	err error
}

// Group starts an empty group on c.
func (c *Comm) Group() *Group { return &Group{c: c} }

func (g *Group) add(l launch, err error) {
	if err != nil && g.err == nil {
		g.err = err
	}
	g.ls = append(g.ls, l)
}

// AllReduce adds an all-reduce (see Comm.AllReduce).
func (g *Group) AllReduce(send, recv comm.Buffer, op comm.Op) { g.add(g.c.allReduce(send, recv, op)) }

// AllGather adds an all-gather.
func (g *Group) AllGather(send, recv comm.Buffer) { g.add(g.c.allGather(send, recv)) }

// ReduceScatter adds a reduce-scatter.
func (g *Group) ReduceScatter(send, recv comm.Buffer, op comm.Op) {
	g.add(g.c.reduceScatter(send, recv, op))
}

// Broadcast adds a broadcast.
func (g *Group) Broadcast(send, recv comm.Buffer, root int) { g.add(g.c.broadcast(send, recv, root)) }

// AllToAll adds an all-to-all (see Comm.AllToAll); its sends and receives
// join the group. In place it is refused: its input is staged on the
// stream when the call is launched, before the group's kernels run, and a
// second in-place exchange in the same group would overwrite the staging
// the first one has yet to send from.
func (g *Group) AllToAll(send, recv comm.Buffer) {
	if send == nil || recv == nil || send.Len() != recv.Len() || send.Len()%g.c.n != 0 {
		g.add(nil, fmt.Errorf("AllToAll: send and recv must have equal lengths, a multiple of %d ranks", g.c.n))
		return
	}
	if sb, ok := send.(*DeviceBuffer); ok {
		if rb, ok := recv.(*DeviceBuffer); ok && sb.ptr < rb.ptr+uintptr(rb.n*rb.dt.Size()) && rb.ptr < sb.ptr+uintptr(sb.n*sb.dt.Size()) {
			g.add(nil, errors.New("AllToAll: in place inside a group (issue it on its own)"))
			return
		}
	}
	counts := make([]int, g.c.n)
	for p := range counts {
		counts[p] = send.Len() / g.c.n
	}
	g.add(g.c.allToAllV(send, counts, recv, counts))
}

// Send adds a send to peer, which may be this rank (paired with a Recv
// from it in the same group).
func (g *Group) Send(buf comm.Buffer, peer int) { g.add(g.c.p2p("Send", buf, peer, true)) }

// Recv adds a receive from peer.
func (g *Group) Recv(buf comm.Buffer, peer int) { g.add(g.c.p2p("Recv", buf, peer, true)) }

// Issue launches the group and returns one handle per call, in the order
// added; they complete together. An invalid call fails the communicator
// (and every handle), as a refused single call does.
func (g *Group) Issue(ctx context.Context) []comm.Handle {
	if g.err != nil {
		h := g.c.refuse("group: %v", g.err)
		hs := make([]comm.Handle, len(g.ls))
		for i := range hs {
			hs[i] = h
		}
		return hs
	}
	if len(g.ls) == 0 {
		return nil
	}
	return g.c.issue(ctx, g.ls)
}

// GroupBackend is overlap's grouped backend mode on GPUs: it issues a
// bucket set as one NCCL group. For a communicator that is not an nccl.Comm
// it falls back to overlap.SequentialGroups.
type GroupBackend struct{}

var _ overlap.GroupBackend = GroupBackend{}

// IssueGroup issues set on cm as one ncclGroupStart/ncclGroupEnd.
func (GroupBackend) IssueGroup(ctx context.Context, cm overlap.Comm, set []overlap.Call) []overlap.Handle {
	c, ok := cm.(*Comm)
	if !ok {
		return overlap.SequentialGroups{}.IssueGroup(ctx, cm, set)
	}
	g := c.Group()
	for _, call := range set {
		switch call.Op {
		case buckets.AllReduce:
			g.AllReduce(call.Send, call.Recv, call.Reduce)
		case buckets.AllGather:
			g.AllGather(call.Send, call.Recv)
		case buckets.ReduceScatter:
			g.ReduceScatter(call.Send, call.Recv, call.Reduce)
		case buckets.Broadcast:
			g.Broadcast(call.Send, call.Recv, 0)
		case buckets.AllToAll:
			g.AllToAll(call.Send, call.Recv)
		default:
			g.add(nil, fmt.Errorf("bucket %q: op %q", call.Bucket, call.Op))
		}
	}
	return g.Issue(ctx)
}
