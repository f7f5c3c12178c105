package buckets

import (
	"errors"
	"fmt"
	"strings"
)

// Filler is the bookkeeping of on-the-fly bucketing for eager programs: the
// executor tells it which tensors became ready (gradients as backward
// produces them) and it answers which buckets may now be started. A bucket
// may start once all its members are ready and every earlier bucket of its
// group has started — the issue order every rank must share. Filler is a
// pure state machine: it copies nothing and starts nothing (the executor
// copies each tensor into the fused buffer at its member's offset and issues
// the collective), and it is not safe for concurrent use; one executor
// goroutine owns it.
type Filler struct {
	plan    *Plan
	index   map[string][]Location
	missing [][]int    // per group, per bucket: members not yet ready
	filled  [][][]bool // per group, bucket, member
	absent  [][][]bool // members flushed without being produced
	next    []int      // per group: the next bucket to start
	group   map[string]int
}

// Startable is a bucket that may be started now.
type Startable struct {
	Group  string
	Index  int // position in the group's issue order
	Bucket *Bucket
	// Absent lists members flushed without being produced; the executor
	// fills their part of the buffer with zeros (an unused parameter's
	// gradient), as DDP does with find_unused_parameters.
	Absent []string
}

// Errors of Filler.
var (
	ErrUnknownTensor = errors.New("buckets: tensor not in the plan")
	ErrTwice         = errors.New("buckets: tensor ready twice")
	ErrUnfilled      = errors.New("buckets: bucket never filled")
)

// NewFiller prepares a filler for one step of p; Reset reuses it.
func NewFiller(p *Plan) *Filler {
	f := &Filler{plan: p, index: p.Index(), group: map[string]int{}}
	for gi, g := range p.Groups {
		f.group[g.Group] = gi
	}
	f.Reset()
	return f
}

// Reset starts a new step.
func (f *Filler) Reset() {
	n := len(f.plan.Groups)
	f.missing, f.filled, f.absent, f.next = make([][]int, n), make([][][]bool, n), make([][][]bool, n), make([]int, n)
	for gi, g := range f.plan.Groups {
		f.missing[gi] = make([]int, len(g.Buckets))
		f.filled[gi] = make([][]bool, len(g.Buckets))
		f.absent[gi] = make([][]bool, len(g.Buckets))
		for bi, b := range g.Buckets {
			f.missing[gi][bi] = len(b.Members)
			f.filled[gi][bi] = make([]bool, len(b.Members))
			f.absent[gi][bi] = make([]bool, len(b.Members))
		}
	}
}

// Ready records that tensor was produced and returns the buckets that may
// start now, in the order to start them. A tensor that travels in several
// buckets (a shard gathered in forward and again in backward) fills its
// first unfilled place each time it is handed in.
func (f *Filler) Ready(tensor string) ([]Startable, error) {
	locs, ok := f.index[tensor]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownTensor, tensor)
	}
	for _, l := range locs {
		gi := f.group[l.Group]
		if f.filled[gi][l.Bucket][l.Member] {
			continue
		}
		f.filled[gi][l.Bucket][l.Member] = true
		f.missing[gi][l.Bucket]--
		return f.advance(gi), nil
	}
	return nil, fmt.Errorf("%w: %q", ErrTwice, tensor)
}

// ReadyAt is Ready for a tensor whose place the caller has already found:
// member mi of bucket bi of group gi (indices in the plan's order), which
// must be the place Ready would fill (its first unfilled one). It saves
// Ready's lookups by name, which an executor handing in hundreds of
// gradients a step pays for each (BenchmarkGraphRunnerStep in overlap).
func (f *Filler) ReadyAt(gi, bi, mi int) ([]Startable, error) {
	if gi < 0 || gi >= len(f.filled) || bi < 0 || bi >= len(f.filled[gi]) || mi < 0 || mi >= len(f.filled[gi][bi]) {
		return nil, fmt.Errorf("%w: no member %d of bucket %d of group %d", ErrUnknownTensor, mi, bi, gi)
	}
	if f.filled[gi][bi][mi] {
		return nil, fmt.Errorf("%w: %q", ErrTwice, f.plan.Groups[gi].Buckets[bi].Members[mi].Tensor)
	}
	f.filled[gi][bi][mi] = true
	f.missing[gi][bi]--
	return f.advance(gi), nil
}

// EndRegion is called when the program leaves a region. Buckets of that
// region marked Flush start with their missing members zero-filled; a
// missing member of any other bucket of the region is an error naming the
// tensor, since ranks would otherwise wait for it forever.
func (f *Filler) EndRegion(region string) ([]Startable, error) {
	var out []Startable
	for gi, g := range f.plan.Groups {
		for bi := range g.Buckets {
			b := &g.Buckets[bi]
			if b.Region != region || f.missing[gi][bi] == 0 {
				continue
			}
			if !b.Flush {
				return nil, f.unfilled(gi, bi)
			}
			for mi := range b.Members {
				if !f.filled[gi][bi][mi] {
					f.filled[gi][bi][mi], f.absent[gi][bi][mi] = true, true
				}
			}
			f.missing[gi][bi] = 0
		}
		out = append(out, f.advance(gi)...)
	}
	return out, nil
}

// Finish checks that every bucket of the step was started; the error names
// the first tensor that never came. It does not reset: call Reset before the
// next step.
func (f *Filler) Finish() error {
	for gi, g := range f.plan.Groups {
		if f.next[gi] < len(g.Buckets) {
			return f.unfilled(gi, f.next[gi])
		}
	}
	return nil
}

func (f *Filler) unfilled(gi, bi int) error {
	b := &f.plan.Groups[gi].Buckets[bi]
	var miss []string
	for mi, m := range b.Members {
		if !f.filled[gi][bi][mi] {
			miss = append(miss, m.Tensor)
		}
	}
	if len(miss) == 0 { // full, but an earlier bucket of the group is not
		return fmt.Errorf("%w: bucket %q of group %q is waiting for an earlier bucket", ErrUnfilled, b.Name, f.plan.Groups[gi].Group)
	}
	return fmt.Errorf("%w: bucket %q of group %q is missing %s", ErrUnfilled, b.Name, f.plan.Groups[gi].Group, strings.Join(miss, ", "))
}

// advance starts, in order, every full bucket at the head of group gi.
func (f *Filler) advance(gi int) []Startable {
	var out []Startable
	g := &f.plan.Groups[gi]
	for f.next[gi] < len(g.Buckets) && f.missing[gi][f.next[gi]] == 0 {
		bi := f.next[gi]
		s := Startable{Group: g.Group, Index: bi, Bucket: &g.Buckets[bi]}
		for mi, m := range g.Buckets[bi].Members {
			if f.absent[gi][bi][mi] {
				s.Absent = append(s.Absent, m.Tensor)
			}
		}
		out = append(out, s)
		f.next[gi]++
	}
	return out
}
