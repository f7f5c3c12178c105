package buckets

import (
	"errors"
	"fmt"
	"slices"
)

// Item is one tensor an eager program will hand to a collective, described
// before the first step (e.g. one per parameter gradient).
type Item struct {
	Tensor    string
	Out       string // defaults to Tensor (in place)
	Bytes     int64
	Group     string
	Op        Op
	DType     string
	Direction Direction
	// Region is the module path of the block that produces the tensor
	// (e.g. "layers.3"); it must be one of Config.Regions for forward and
	// backward items.
	Region string
}

// ErrUnknownRegion is returned by Assign for a forward or backward item whose
// region is not in the region order: without it the item has no place in
// block order.
var ErrUnknownRegion = errors.New("buckets: unknown region")

// Assign plans buckets for an eager program, which has no step graph: items
// of one group, op, dtype, direction and region (one block) merge, in the
// order given (the order they become ready), packed up to cfg.Cap().
//
// Buckets are issued per group by direction (forward, backward, optimizer,
// then None) and, inside a direction, by block: forward buckets in the order
// of regions, backward buckets in reverse (the last block's gradients are
// ready first), optimizer buckets in order. regions is the forward block
// order. The result is the same on every rank for the same input.
func Assign(items []Item, regions []string, cfg Config) (*Plan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rank := map[string]int{}
	for i, r := range regions {
		rank[r] = i
	}
	type key struct {
		group, dtype, region string
		op                   Op
		dir                  Direction
	}
	var keys []key
	byKey := map[key][]Item{}
	seen := map[string]bool{}
	for _, it := range items {
		if seen[it.Tensor] {
			return nil, fmt.Errorf("%w: tensor %q listed twice", ErrBadPlan, it.Tensor)
		}
		seen[it.Tensor] = true
		if !it.Op.Valid() || DTypeSize(it.DType) == 0 || it.Bytes <= 0 || !it.Direction.Valid() {
			return nil, fmt.Errorf("%w: tensor %q: bad op %q, dtype %q, direction %q or size %d", ErrBadPlan, it.Tensor, it.Op, it.DType, it.Direction, it.Bytes)
		}
		if _, ok := rank[it.Region]; !ok && (it.Direction == Forward || it.Direction == Backward) {
			return nil, fmt.Errorf("%w: tensor %q names region %q", ErrUnknownRegion, it.Tensor, it.Region)
		}
		k := key{it.Group, it.DType, it.Region, it.Op, it.Direction}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], it)
	}
	dirRank := map[Direction]int{Forward: 0, Backward: 1, Optimizer: 2, None: 3}
	first := map[key]int{}
	for i, k := range keys {
		first[k] = i
	}
	// Stable sort: ties (same direction and block) keep first-appearance
	// order, which is the caller's ready order.
	slices.SortStableFunc(keys, func(a, b key) int {
		if a.group != b.group {
			if a.group < b.group {
				return -1
			}
			return 1
		}
		if d := dirRank[a.dir] - dirRank[b.dir]; d != 0 {
			return d
		}
		ra, rb := rank[a.region], rank[b.region]
		if a.dir == Backward {
			ra, rb = rb, ra
		}
		if a.dir != None && ra != rb {
			return ra - rb
		}
		return first[a] - first[b]
	})
	p := &Plan{}
	sets := 0
	for _, k := range keys {
		if len(p.Groups) == 0 || p.Groups[len(p.Groups)-1].Group != k.group {
			p.Groups = append(p.Groups, GroupPlan{Group: k.group})
		}
		gp := &p.Groups[len(p.Groups)-1]
		its := byKey[k]
		sizes := make([]int64, len(its))
		for i, it := range its {
			sizes[i] = it.Bytes
		}
		for _, r := range Pack(sizes, cfg.Cap()) {
			// Without a schedule nothing says which buckets are issued
			// back to back: every bucket is a set of its own (an eager
			// executor can group what one Filler call returns).
			b := Bucket{Op: k.op, DType: k.dtype, Direction: k.dir, Region: k.region, Set: sets}
			sets++
			b.Name = fmt.Sprintf("%s/%s/%s/%d", k.group, k.dir, k.region, len(gp.Buckets))
			for _, it := range its[r[0]:r[1]] {
				out := it.Out
				if out == "" {
					out = it.Tensor
				}
				b.Members = append(b.Members, Member{Tensor: it.Tensor, Out: out, Offset: b.Bytes, Bytes: it.Bytes})
				b.Bytes += it.Bytes
			}
			gp.Buckets = append(gp.Buckets, b)
		}
	}
	return p, p.Validate()
}
