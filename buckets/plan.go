package buckets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
)

// Member is one tensor inside a bucket.
type Member struct {
	// Tensor is the input the collective reads (e.g. a gradient).
	Tensor string `json:"tensor"`
	// Out is where the result lands after the wait (may equal Tensor for an
	// in-place collective in an eager program).
	Out string `json:"out"`
	// Offset of the member in the bucket's fused input buffer, in bytes.
	// Members are packed in order without gaps; the executor copies (or
	// views) Tensor at Offset before the start and scatters results back
	// before the wait returns.
	Offset int64 `json:"offset"`
	// Bytes of the member's input.
	Bytes int64 `json:"bytes"`
}

// Bucket is one collective over a fused buffer.
type Bucket struct {
	// Name identifies the bucket in logs and traces (the name of its start
	// node when the plan comes from a step graph).
	Name      string    `json:"name"`
	Op        Op        `json:"op"`
	DType     string    `json:"dtype"`
	Direction Direction `json:"direction,omitempty"`
	// Region is where the bucket is issued (its last member's region).
	Region string `json:"region,omitempty"`
	// Bytes is the size of the fused input buffer: the sum of the members.
	Bytes   int64    `json:"bytes"`
	Members []Member `json:"members"`
	// Flush lets an eager executor start the bucket at the end of its
	// region with members that were not produced this step, zero-filled
	// (parameters unused in some steps). Without it a missing member is an
	// error (see Filler.EndRegion).
	Flush bool `json:"flush,omitempty"`
	// Set numbers the runs of buckets issued back to back, with no compute
	// or wait between them, across all groups of the step. A backend with
	// group semantics (NCCL) issues one set as one grouped call; the native
	// executor may ignore it. Sets count up in issue order from 0.
	Set int `json:"set"`
}

// GroupPlan lists the buckets of one process group in issue order.
type GroupPlan struct {
	Group   string   `json:"group"`
	Buckets []Bucket `json:"buckets"`
}

// Plan is the bucket plan of one step.
//
// Ordering obligations for an executor: on each group, every rank issues
// bucket k before bucket k+1 (collectives on one group complete in issue
// order, so a wait on bucket k also completes every earlier bucket of that
// group); groups are independent of one another. A bucket is started only
// after all of its members have been produced, and results are scattered back
// to every member's Out before its wait returns.
type Plan struct {
	// Groups are sorted by group name, so that equal plans are equal values.
	Groups []GroupPlan `json:"groups"`
}

// ErrBadPlan is wrapped by every error Plan.Validate returns.
var ErrBadPlan = errors.New("buckets: bad plan")

// Validate checks the structural promises a plan makes to its executor:
// groups sorted and unique, members packed without gaps or overlaps at
// element-aligned offsets, each output in at most one bucket of the plan. An
// input may travel more than once (a shard gathered in forward and again in
// backward), an output never: two buckets writing one tensor would race.
func (p *Plan) Validate() error {
	seen := map[string]string{}
	for gi, g := range p.Groups {
		if gi > 0 && p.Groups[gi-1].Group >= g.Group {
			return fmt.Errorf("%w: groups not sorted or repeated at %q", ErrBadPlan, g.Group)
		}
		for _, b := range g.Buckets {
			if !b.Op.Valid() {
				return fmt.Errorf("%w: bucket %q: unknown op %q", ErrBadPlan, b.Name, b.Op)
			}
			es := DTypeSize(b.DType)
			if es == 0 {
				return fmt.Errorf("%w: bucket %q: unknown dtype %q", ErrBadPlan, b.Name, b.DType)
			}
			if len(b.Members) == 0 {
				return fmt.Errorf("%w: bucket %q has no members", ErrBadPlan, b.Name)
			}
			off := int64(0)
			for _, m := range b.Members {
				if m.Offset != off {
					return fmt.Errorf("%w: bucket %q: member %q at offset %d, want %d", ErrBadPlan, b.Name, m.Tensor, m.Offset, off)
				}
				if m.Bytes <= 0 || m.Bytes%es != 0 {
					return fmt.Errorf("%w: bucket %q: member %q has %d bytes, not a positive multiple of %s", ErrBadPlan, b.Name, m.Tensor, m.Bytes, b.DType)
				}
				if m.Out == "" {
					return fmt.Errorf("%w: bucket %q: member %q has no output", ErrBadPlan, b.Name, m.Tensor)
				}
				if prev, dup := seen[m.Out]; dup {
					return fmt.Errorf("%w: output %q written by buckets %q and %q", ErrBadPlan, m.Out, prev, b.Name)
				}
				seen[m.Out] = b.Name
				off += m.Bytes
			}
			if off != b.Bytes {
				return fmt.Errorf("%w: bucket %q: members sum to %d bytes, bucket says %d", ErrBadPlan, b.Name, off, b.Bytes)
			}
		}
	}
	return nil
}

// Hash is a cheap fingerprint of everything ranks must agree on: per group,
// the buckets in order with their op, dtype, size and members. Names of
// buckets are left out (they are labels), member tensor names are in (a rank
// that packs a different tensor at an offset would corrupt data). FNV-1a is
// enough: this detects programming mistakes, not adversaries.
func (p *Plan) Hash() uint64 {
	h := fnv.New64a()
	var buf [8]byte
	num := func(v int64) {
		binary.LittleEndian.PutUint64(buf[:], uint64(v))
		h.Write(buf[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		h.Write([]byte(s))
	}
	for _, g := range p.Groups {
		str(g.Group)
		num(int64(len(g.Buckets)))
		for _, b := range g.Buckets {
			str(string(b.Op))
			str(b.DType)
			num(b.Bytes)
			if b.Flush {
				num(1)
			} else {
				num(0)
			}
			num(int64(b.Set))
			num(int64(len(b.Members)))
			for _, m := range b.Members {
				str(m.Tensor)
				num(m.Offset)
				num(m.Bytes)
			}
		}
	}
	return h.Sum64()
}

// Location says where a tensor travels.
type Location struct {
	Group  string
	Bucket int // index in the group's issue order
	Member int // index in the bucket
}

// Index maps every member's input tensor to where it travels, for an eager
// executor that receives tensors one at a time as they become ready. A
// tensor that travels more than once (a shard gathered in forward and again
// in backward) has its locations in group then issue order.
func (p *Plan) Index() map[string][]Location {
	idx := map[string][]Location{}
	for _, g := range p.Groups {
		for bi, b := range g.Buckets {
			for mi, m := range b.Members {
				idx[m.Tensor] = append(idx[m.Tensor], Location{Group: g.Group, Bucket: bi, Member: mi})
			}
		}
	}
	return idx
}

// String renders the plan one bucket per line, the form golden files use.
func (p *Plan) String() string {
	var sb strings.Builder
	for _, g := range p.Groups {
		fmt.Fprintf(&sb, "group %s\n", g.Group)
		for i, b := range g.Buckets {
			fmt.Fprintf(&sb, "  %d %s %s %s", i, b.Op, b.DType, b.Direction)
			if b.Region != "" {
				fmt.Fprintf(&sb, " %s", b.Region)
			}
			if b.Flush {
				sb.WriteString(" flush")
			}
			fmt.Fprintf(&sb, " set%d %dB:", b.Set, b.Bytes)
			for _, m := range b.Members {
				fmt.Fprintf(&sb, " %s@%d", m.Tensor, m.Offset)
			}
			sb.WriteByte('\n')
		}
	}
	fmt.Fprintf(&sb, "hash %016x\n", p.Hash())
	return sb.String()
}
