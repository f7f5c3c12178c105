package overlap

import (
	"context"
	"fmt"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
)

// Comm is what the executor needs from a communicator: comm.Communicator
// and the nccl backend satisfy it. Every method returns at once with a
// Handle; calls complete in issue order (comm's contract, which the
// executor's wait logic relies on).
type Comm interface {
	Rank() int
	Size() int
	AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) comm.Handle
	AllGather(ctx context.Context, send, recv comm.Buffer) comm.Handle
	ReduceScatter(ctx context.Context, send, recv comm.Buffer, op comm.Op) comm.Handle
	Broadcast(ctx context.Context, send, recv comm.Buffer, root int) Handle
}

// AllToAller is implemented by communicators that run all_to_all
// (comm.Communicator does): send holds Size equal blocks, block p for rank
// p; recv receives block q from rank q. Plans with all_to_all buckets need
// it.
type AllToAller interface {
	AllToAll(ctx context.Context, send, recv comm.Buffer) Handle
}

var _ AllToAller = comm.Communicator(nil)

// Handle is comm.Handle, named here so Comm reads as one contract.
type Handle = comm.Handle

var _ Comm = comm.Communicator(nil)

// Call is one bucket's collective, ready to issue.
type Call struct {
	Bucket string      // for logs and errors
	Op     buckets.Op  // all_reduce, all_gather, reduce_scatter, broadcast or all_to_all
	Reduce comm.Op     // the reduction, for all_reduce and reduce_scatter
	Send   comm.Buffer // fused input
	Recv   comm.Buffer // fused output (the same memory as Send when in place)
}

// Issue starts c on cm. It does not block.
func (c Call) Issue(ctx context.Context, cm Comm) Handle {
	switch c.Op {
	case buckets.AllReduce:
		return cm.AllReduce(ctx, c.Send, c.Recv, c.Reduce)
	case buckets.AllGather:
		return cm.AllGather(ctx, c.Send, c.Recv)
	case buckets.ReduceScatter:
		return cm.ReduceScatter(ctx, c.Send, c.Recv, c.Reduce)
	case buckets.Broadcast:
		return cm.Broadcast(ctx, c.Send, c.Recv, 0)
	case buckets.AllToAll:
		// Optional for a Comm (the GPU backend may not offer it): checked
		// here, at the call, rather than widening the interface.
		if a, ok := cm.(AllToAller); ok {
			return a.AllToAll(ctx, c.Send, c.Recv)
		}
		return failed(fmt.Errorf("%w: bucket %q: the communicator has no all_to_all", ErrPlan, c.Bucket))
	}
	return failed(fmt.Errorf("%w: bucket %q: op %q", ErrPlan, c.Bucket, c.Op))
}

// GroupBackend issues a bucket set as one grouped call: every call of set is
// started, in order, and one handle per call is returned. It must not block
// on completion. The calls of one set never depend on each other's results.
type GroupBackend interface {
	IssueGroup(ctx context.Context, cm Comm, set []Call) []Handle
}

// SequentialGroups is the GroupBackend for communicators without group
// semantics (comm's CPU engine): it issues the set's calls back to back,
// which comm already pipelines. nccl.GroupBackend issues the same set
// between ncclGroupStart and ncclGroupEnd.
type SequentialGroups struct{}

var _ GroupBackend = SequentialGroups{}

// IssueGroup issues every call of set in order.
func (SequentialGroups) IssueGroup(ctx context.Context, cm Comm, set []Call) []Handle {
	hs := make([]Handle, len(set))
	for i, c := range set {
		hs[i] = c.Issue(ctx, cm)
	}
	return hs
}

// failedHandle is a Handle that has already failed, for calls the executor
// refuses without issuing.
type failedHandle struct{ err error }

func failed(err error) Handle                     { return failedHandle{err} }
func (f failedHandle) Wait(context.Context) error { return f.err }
func (f failedHandle) Done() bool                 { return true }
