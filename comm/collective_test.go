package comm_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
)

// tcase is one collective call that every rank issues.
type tcase struct {
	kind    comm.Kind
	dt      comm.DType
	op      comm.Op
	count   int // elements per rank (per block for AllGather, ReduceScatter, AllToAll)
	root    int
	inplace bool
	idx     int
}

func (tc tcase) String() string {
	return fmt.Sprintf("#%d %v %v %v count=%d root=%d inplace=%v", tc.idx, tc.kind, tc.dt, tc.op, tc.count, tc.root, tc.inplace)
}

// input is rank r's data for tc: small integers when exact (every reduction
// order then gives the same bits), random values otherwise.
func input(tc tcase, r, count int, exact bool) []byte {
	rng := rand.New(rand.NewPCG(uint64(tc.idx), uint64(r)))
	vals := make([]float64, count)
	signed := tc.dt != comm.Uint8
	for i := range vals {
		switch {
		case tc.op == comm.Prod && exact:
			vals[i] = float64(1 + rng.IntN(2)) // products of up to 7 stay exact in bfloat16
			if signed && rng.IntN(4) == 0 {
				vals[i] = -vals[i]
			}
		case exact || tc.dt == comm.Int32 || tc.dt == comm.Int64 || tc.dt == comm.Uint8:
			vals[i] = float64(rng.IntN(6))
			if signed && exact {
				vals[i] -= 2
			}
		default:
			vals[i] = rng.Float64()*2 - 1
		}
	}
	return commtest.Encode(tc.dt, vals)
}

func a2aCounts(tc tcase, n int) [][]int {
	c := make([][]int, n)
	for p := range n {
		c[p] = make([]int, n)
		for q := range n {
			c[p][q] = (p + 2*q + tc.idx + tc.count) % 3
			if tc.count == 0 {
				c[p][q] = 0
			}
		}
	}
	return c
}

// cases lists calls of every kind × dtype × op × size, in one fixed order.
func cases(n int, sizes []int) []tcase {
	var out []tcase
	add := func(tc tcase) {
		tc.idx = len(out)
		tc.inplace = tc.idx%2 == 1
		tc.root = tc.idx % n
		out = append(out, tc)
	}
	for _, size := range sizes {
		for _, dt := range comm.DTypes {
			for _, op := range comm.Ops {
				add(tcase{kind: comm.KindAllReduce, dt: dt, op: op, count: size})
				add(tcase{kind: comm.KindReduceScatter, dt: dt, op: op, count: size})
				add(tcase{kind: comm.KindReduce, dt: dt, op: op, count: size})
			}
			for _, k := range []comm.Kind{comm.KindAllGather, comm.KindBroadcast, comm.KindAllToAll, comm.KindAllToAllV} {
				add(tcase{kind: k, dt: dt, count: size})
			}
		}
	}
	return out
}

func mustBuf(dt comm.DType, b []byte) comm.Buffer {
	buf, err := comm.Bytes(dt, b)
	if err != nil {
		panic(err)
	}
	return buf
}

// issue starts tc on c and returns the handle and a check of the result.
func issue(ctx context.Context, c comm.Communicator, tc tcase, exact bool) (comm.Handle, func() error) {
	n, me, dt, es := c.Size(), c.Rank(), tc.dt, tc.dt.Size()
	in := func(r, count int) []byte {
		k := fmt.Sprintf("in/%v/%v/%d/%d", tc, exact, r, count)
		return append([]byte(nil), memoKey(k, func() []byte { return input(tc, r, count, exact) })...)
	}
	all := func(count int) [][]byte {
		var xs [][]byte
		for r := range n {
			xs = append(xs, in(r, count))
		}
		return xs
	}
	ref := func(f func() []byte) []byte { return memo(tc, exact, n, me, f) }
	var h comm.Handle
	var got, want []byte
	switch tc.kind {
	case comm.KindAllReduce:
		send := in(me, tc.count)
		got = send
		if !tc.inplace {
			got = make([]byte, len(send))
		}
		h = c.AllReduce(ctx, mustBuf(dt, send), mustBuf(dt, got), tc.op)
		want = ref(func() []byte { return commtest.AllReduce(tc.op, dt, all(tc.count)) })
	case comm.KindReduceScatter:
		send := in(me, tc.count*n)
		got = make([]byte, tc.count*es)
		if tc.inplace {
			got = send[me*tc.count*es : (me+1)*tc.count*es]
		}
		h = c.ReduceScatter(ctx, mustBuf(dt, send), mustBuf(dt, got), tc.op)
		want = ref(func() []byte { return commtest.AllReduce(tc.op, dt, all(tc.count*n)) })
		want = want[me*tc.count*es : (me+1)*tc.count*es]
	case comm.KindReduce:
		send := in(me, tc.count)
		var recv comm.Buffer
		if me == tc.root {
			got = send
			if !tc.inplace {
				got = make([]byte, len(send))
			}
			recv = mustBuf(dt, got)
			want = ref(func() []byte { return commtest.AllReduce(tc.op, dt, all(tc.count)) })
		}
		h = c.Reduce(ctx, mustBuf(dt, send), recv, tc.op, tc.root)
	case comm.KindAllGather:
		got = make([]byte, tc.count*n*es)
		send := in(me, tc.count)
		if tc.inplace {
			blk := got[me*tc.count*es : (me+1)*tc.count*es]
			copy(blk, send)
			send = blk
		}
		h = c.AllGather(ctx, mustBuf(dt, send), mustBuf(dt, got))
		want = commtest.AllGather(all(tc.count))
	case comm.KindBroadcast:
		want = in(tc.root, tc.count)
		got = make([]byte, tc.count*es)
		send := mustBuf(dt, want)
		if me != tc.root {
			send = nil
		} else if tc.inplace {
			copy(got, want)
			send = mustBuf(dt, got)
		}
		h = c.Broadcast(ctx, send, mustBuf(dt, got), tc.root)
	case comm.KindAllToAll, comm.KindAllToAllV:
		counts := a2aCounts(tc, n)
		if tc.kind == comm.KindAllToAll {
			for p := range counts {
				for q := range counts[p] {
					counts[p][q] = tc.count
				}
			}
		}
		ins := make([][]byte, n)
		for r := range n {
			t := 0
			for _, k := range counts[r] {
				t += k
			}
			ins[r] = in(r, t)
		}
		want = commtest.AllToAllV(dt, ins, counts, me)
		send := ins[me]
		got = make([]byte, max(len(want), len(send)))
		if tc.inplace && len(want) == len(send) {
			copy(got, send)
			send = got
		}
		if tc.kind == comm.KindAllToAll {
			h = c.AllToAll(ctx, mustBuf(dt, send), mustBuf(dt, got))
		} else {
			rc := make([]int, n)
			for p := range n {
				rc[p] = counts[p][me]
			}
			h = c.AllToAllV(ctx, mustBuf(dt, send), counts[me], mustBuf(dt, got), rc)
		}
		got = got[:len(want)]
	}
	return h, func() error {
		if want != nil && !bytes.Equal(got, want) {
			return fmt.Errorf("rank %d: %v: got % x, want % x", me, tc, head(got), head(want))
		}
		return nil
	}
}

// memo shares reference results between the ranks of one job: computing
// them once per call instead of once per rank keeps the suite fast under -race.
var (
	memoMu  sync.Mutex
	memoMap = map[string][]byte{}
)

func memo(tc tcase, exact bool, n, me int, f func() []byte) []byte {
	return memoKey(fmt.Sprintf("%v/%v/%d", tc, exact, n), f)
}

func memoKey(k string, f func() []byte) []byte {
	memoMu.Lock()
	v, ok := memoMap[k]
	memoMu.Unlock()
	if ok {
		return v
	}
	v = f() // outside the lock: f may itself use memoKey
	memoMu.Lock()
	memoMap[k] = v
	memoMu.Unlock()
	return v
}

func head(b []byte) []byte { return b[:min(len(b), 32)] }

func TestCollectivesMatchReference(t *testing.T) {
	sizes := []int{0, 1, 13, 1031}
	ranks := []int{1, 2, 3, 4, 7}
	if testing.Short() {
		sizes = []int{0, 13}
		ranks = []int{1, 3, 4}
	}
	configs := map[string]func(*comm.Config){
		// Forces recursive doubling / gather-to-all: latency dominates.
		"latency": func(c *comm.Config) { c.LatencyNs = 1e9 },
		// Forces the ring wherever counts allow; small segments exercise
		// pipelining on small test sizes.
		"bandwidth": func(c *comm.Config) { c.LatencyNs = 1e-3; c.SegmentBytes = 4096 },
		"deterministic": func(c *comm.Config) {
			c.Deterministic = true
			c.LatencyNs = 1e-3
			c.SegmentBytes = 4096
		},
		"deterministic-small": func(c *comm.Config) { c.Deterministic = true; c.LatencyNs = 1e9 },
	}
	for _, n := range ranks {
		for name, mod := range configs {
			t.Run(fmt.Sprintf("n=%d/%s", n, name), func(t *testing.T) {
				cfg := comm.LocalConfig()
				mod(&cfg)
				exact := !cfg.Deterministic
				j := newMemJob(t, n, cfg)
				tcs := cases(n, sizes)
				errs := onEach(t, n, func(r int) error {
					ctx, cancel := waitCtx(t)
					defer cancel()
					hs := make([]comm.Handle, len(tcs))
					checks := make([]func() error, len(tcs))
					for i, tc := range tcs {
						hs[i], checks[i] = issue(ctx, j.comms[r], tc, exact)
					}
					for i, h := range hs {
						if err := h.Wait(ctx); err != nil {
							return fmt.Errorf("%v: %w", tcs[i], err)
						}
						// In-order completion: every earlier call is done.
						for k := range i {
							if !hs[k].Done() {
								return fmt.Errorf("call %d completed before call %d", i, k)
							}
						}
						if err := checks[i](); err != nil {
							return err
						}
					}
					return nil
				})
				for _, err := range errs {
					if err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
}
