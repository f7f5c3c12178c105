// Command moe is an expert-parallel (mixture-of-experts) layer run over the
// ranks gorun starts: one expert per rank, every token routed to one expert,
// dispatched to the expert's rank and combined back with all_to_allv, since
// routing sends a different number of tokens to each expert (the splits are
// uneven and change every step).
//
//	gorun -np 4 bin/moe --chunks 2
//
// With --chunks C the local tokens are split into C chunks, and chunk c+1's
// dispatch runs while the expert computes chunk c (the chunking that
// stepgraph's Chunk pass makes of an expert-parallel block; here written
// out, because the graph runner's all_to_all takes equal blocks only). Each
// chunk first exchanges its per-expert token counts (all_to_all of one int
// per rank), so every rank knows how many rows it receives from each peer,
// then the rows (all_to_allv).
//
// Every step every rank checks its combined output against the expert
// computed locally (the experts' weights are a function of the expert's
// index, so any rank can compute any expert): the result must be the same
// bits whatever rank computed it and however many chunks were used. A
// mismatch is an error naming the step, token and expert, and exit status 1.
// Rank 0 prints the tokens each expert received on the first step (uneven
// by construction: expert 0 gets about half) and the step time, the median
// over steps of the slowest rank's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
	"github.com/rs/zerolog"
)

type options struct {
	tokens, dim, chunks, steps int
}

func main() {
	var o options
	flag.IntVar(&o.tokens, "tokens", 512, "tokens per rank per step")
	flag.IntVar(&o.dim, "dim", 64, "token width (the expert is a dim × dim matrix)")
	flag.IntVar(&o.chunks, "chunks", 2, "chunks the tokens are split into, to overlap dispatch with the expert")
	flag.IntVar(&o.steps, "steps", 5, "steps")
	flag.Parse()
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ropts := rank.DefaultOptions()
	ropts.Logger = zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	r, err := rank.Init(ctx, ropts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moe: %v\n", err)
		os.Exit(1)
	}
	err = run(ctx, r.Comm(), o)
	if err != nil {
		r.Abort(err)
	}
	if err = errors.Join(err, r.Close()); err != nil {
		fmt.Fprintf(os.Stderr, "moe: rank %d: %v\n", r.Rank(), err)
		os.Exit(1)
	}
}

func (o options) validate() error {
	switch {
	case o.tokens < 1 || o.dim < 1 || o.steps < 1:
		return fmt.Errorf("moe: --tokens %d, --dim %d, --steps %d: each must be at least 1", o.tokens, o.dim, o.steps)
	case o.chunks < 1 || o.chunks > o.tokens:
		return fmt.Errorf("moe: --chunks %d: need 1 to --tokens (%d)", o.chunks, o.tokens)
	}
	return nil
}

// mix is splitmix64's finaliser: routing and values from integers, the same
// on every rank.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// route is the expert of token t of rank k at step s: about half go to
// expert 0 and the rest spread evenly, so the all_to_allv splits differ
// between peers and steps.
func route(k, s, t, n int) int {
	e := int(mix(uint64(k)<<40^uint64(s)<<20^uint64(t)) % uint64(2*n))
	if e >= n {
		return 0
	}
	return e
}

// value is element j of token t of rank k at step s: a small float with
// few mantissa bits, so nothing depends on exact inputs by luck.
func value(k, s, t, j int) float32 {
	return float32(int(mix(uint64(k)<<44^uint64(s)<<32^uint64(t)<<12^uint64(j))%17)-8) / 8
}

// weights is expert e's dim × dim matrix, row-major.
func weights(e, dim int) []float32 {
	w := make([]float32, dim*dim)
	for i := range w {
		w[i] = float32(int(mix(uint64(e)<<32^uint64(i))%9)-4) / 16
	}
	return w
}

// expert writes y = x·W for each row of x (rows of dim), summing in one
// fixed order so any rank computing it gets the same bits.
func expert(w, x, y []float32, dim int) {
	for r := 0; r+dim <= len(x); r += dim {
		xr, yr := x[r:r+dim], y[r:r+dim]
		for j := range yr {
			var acc float32
			for i, xv := range xr {
				acc += xv * w[i*dim+j]
			}
			yr[j] = acc
		}
	}
}

// chunk is one chunk's routing and buffers on this rank.
type chunk struct {
	lo, hi     int   // local tokens [lo, hi)
	order      []int // local token of each dispatched row, grouped by expert
	sendCounts []int // elements to each rank
	recvCounts []int // elements from each rank
	counts     []int64
	peerCounts []int64
	send, recv []float32 // rows dispatched, grouped by expert; rows received from each rank
	back       []float32 // combined rows, in order
	hCounts    comm.Handle
	hDisp      comm.Handle
	hComb      comm.Handle
}

func run(ctx context.Context, c *comm.Comm, o options) error {
	n, k, D := c.Size(), c.Rank(), o.dim
	mine := weights(k, D)
	all := make([][]float32, n) // every expert, for the local check
	for e := range all {
		all[e] = weights(e, D)
	}
	x := make([]float32, o.tokens*D)
	out := make([]float32, o.tokens*D)
	var times []time.Duration
	for s := range o.steps {
		for t := range o.tokens {
			for j := range D {
				x[t*D+j] = value(k, s, t, j)
			}
		}
		if err := c.Barrier(ctx).Wait(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		received, err := step(ctx, c, o, s, x, out, mine)
		if err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		d := []float64{float64(time.Since(t0))}
		if err := c.AllReduce(ctx, comm.Float64s(d), comm.Float64s(d), comm.Max).Wait(ctx); err != nil {
			return err
		}
		times = append(times, time.Duration(d[0]))
		// The check: every token's output is its expert applied to it.
		want := make([]float32, D)
		for t := range o.tokens {
			e := route(k, s, t, n)
			expert(all[e], x[t*D:(t+1)*D], want, D)
			if got := out[t*D : (t+1)*D]; !slices.Equal(got, want) {
				return fmt.Errorf("step %d: token %d (expert %d on rank %d): got %v, want %v", s, t, e, e, got[:min(4, D)], want[:min(4, D)])
			}
		}
		// Tokens each expert received, gathered for rank 0's report.
		per := make([]int64, n)
		if err := c.AllGather(ctx, comm.Int64s([]int64{int64(received)}), comm.Int64s(per)).Wait(ctx); err != nil {
			return err
		}
		if k == 0 && s == 0 {
			fmt.Printf("moe: %d ranks (one expert each), %d tokens of %d floats per rank, %d chunks; step 1 tokens per expert %v (all_to_allv, uneven)\n",
				n, o.tokens, D, o.chunks, per)
		}
	}
	slices.Sort(times)
	if k == 0 {
		fmt.Printf("moe: %d steps verified bit for bit against the local experts; median step %.3f ms (slowest rank)\n",
			o.steps, float64(times[len(times)/2].Microseconds())/1e3)
	}
	return nil
}

// step routes, dispatches, runs this rank's expert and combines one step's
// tokens x into out, chunk by chunk, and returns how many tokens this
// rank's expert processed. Every rank issues the same calls in the same
// order: each chunk's count exchange and dispatch up front, then, as each
// dispatch arrives, the expert on it and its combine.
func step(ctx context.Context, c *comm.Comm, o options, s int, x, out, w []float32) (int, error) {
	n, k, D := c.Size(), c.Rank(), o.dim
	chunks := make([]*chunk, o.chunks)
	for ci := range chunks {
		ch := &chunk{lo: ci * o.tokens / o.chunks, hi: (ci + 1) * o.tokens / o.chunks,
			sendCounts: make([]int, n), recvCounts: make([]int, n), counts: make([]int64, n), peerCounts: make([]int64, n)}
		// Group the chunk's tokens by expert (stable: token order within
		// an expert), which is the layout all_to_allv sends: rank p's rows
		// one after the other.
		for e := range n {
			for t := ch.lo; t < ch.hi; t++ {
				if route(k, s, t, n) == e {
					ch.order = append(ch.order, t)
					ch.counts[e]++
				}
			}
		}
		ch.send = make([]float32, len(ch.order)*D)
		for i, t := range ch.order {
			copy(ch.send[i*D:(i+1)*D], x[t*D:(t+1)*D])
		}
		ch.hCounts = c.AllToAll(ctx, comm.Int64s(ch.counts), comm.Int64s(ch.peerCounts))
		chunks[ci] = ch
	}
	for _, ch := range chunks {
		if err := ch.hCounts.Wait(ctx); err != nil {
			return 0, err
		}
		rows := 0
		for p := range n {
			ch.sendCounts[p] = int(ch.counts[p]) * D
			ch.recvCounts[p] = int(ch.peerCounts[p]) * D
			rows += int(ch.peerCounts[p])
		}
		ch.recv = make([]float32, rows*D)
		ch.hDisp = c.AllToAllV(ctx, comm.Float32s(ch.send), ch.sendCounts, comm.Float32s(ch.recv), ch.recvCounts)
	}
	received := 0
	for _, ch := range chunks {
		if err := ch.hDisp.Wait(ctx); err != nil {
			return 0, err
		}
		// The expert (a row's output has the row's size, so the combine
		// sends back what the dispatch brought); later chunks' dispatches
		// are in flight meanwhile.
		y := make([]float32, len(ch.recv))
		expert(w, ch.recv, y, D)
		received += len(y) / D
		ch.back = make([]float32, len(ch.send))
		ch.hComb = c.AllToAllV(ctx, comm.Float32s(y), ch.recvCounts, comm.Float32s(ch.back), ch.sendCounts)
	}
	for _, ch := range chunks {
		if err := ch.hComb.Wait(ctx); err != nil {
			return 0, err
		}
		// Rows came back in the order they were sent: undo the grouping.
		for i, t := range ch.order {
			copy(out[t*D:(t+1)*D], ch.back[i*D:(i+1)*D])
		}
	}
	return received, nil
}
