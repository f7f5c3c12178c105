// Command fusion measures, between the ranks gorun starts, what fusing
// small all-reduces on the fly buys, against one all-reduce of the same
// total size, and what a lone small all-reduce costs:
//
//	gorun -np 2 bin/fusion-bench [-blocks 30 -per 40]
//
// Rows (float32 sum, in place, microseconds per row iteration):
//
//	lone-8B      one 8-byte all-reduce, issued and waited for (latency)
//	single-64K   one 64 KiB all-reduce, issued and waited for (the anchor)
//	async-64x1K  64 all-reduces of 1 KiB issued to the worker one after
//	             another, then waited for, as an async loop does
//	burst-64x1K  the same 64 issued with comm.IssuerWaits (nothing runs
//	             until the first Wait), as a program that waits at once can
//	coalesced-64x1K  the same 64 vectors as one AllReduceCoalesced call
//	             (coalesced.go; only in builds that have it)
//
// The rows run in interleaved blocks of -per iterations (every rank runs
// the same blocks; a barrier starts each); rank 0 prints each row's median
// over the blocks, one line per row ("row <name> <median us> <blocks>").
// It uses only comm's long-standing API, so the same source builds
// against a checkout without fusion, which is how scripts/bench-fusion.sh
// measures before and after.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
)

func main() {
	blocks := flag.Int("blocks", 30, "blocks per row")
	per := flag.Int("per", 40, "row iterations per block")
	only := flag.String("rows", "", "comma-separated rows to run (default all)")
	prof := flag.String("cpuprofile", "", "write rank 0's CPU profile here")
	flag.Parse()
	if *prof != "" && os.Getenv("RANK") == "0" {
		f, err := os.Create(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fusion-bench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	rowFilter = *only
	if err := run(*blocks, *per); err != nil {
		fmt.Fprintln(os.Stderr, "fusion-bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// rowFilter is the -rows flag.
var rowFilter string

// extraRows add rows that need API a "before" build lacks (coalesced.go,
// which scripts/bench-fusion.sh does not copy there).
var extraRows []func(c *comm.Comm, smalls [][]float32) row

type row struct {
	name string
	once func(ctx context.Context) error
}

func run(blocks, per int) error {
	ctx := context.Background()
	opts := rank.DefaultOptions()
	opts.RequireLauncher = true
	r, err := rank.Init(ctx, opts)
	if err != nil {
		return err
	}
	defer r.Close()
	c := r.Comm()
	const small, many = 256, 64 // 1 KiB of float32, 64 of them
	lone := make([]float32, 2)
	single := make([]float32, small*many)
	smalls := make([][]float32, many)
	for i := range smalls {
		smalls[i] = make([]float32, small)
	}
	hs := make([]comm.Handle, many)
	waitAll := func(ctx context.Context) error {
		for _, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	rows := []row{
		{"lone-8B", func(ctx context.Context) error {
			b := comm.Float32s(lone)
			return c.AllReduce(ctx, b, b, comm.Sum).Wait(ctx)
		}},
		{"single-64K", func(ctx context.Context) error {
			b := comm.Float32s(single)
			return c.AllReduce(ctx, b, b, comm.Sum).Wait(ctx)
		}},
		{"async-64x1K", func(ctx context.Context) error {
			for i, s := range smalls {
				b := comm.Float32s(s)
				hs[i] = c.AllReduce(ctx, b, b, comm.Sum)
			}
			return waitAll(ctx)
		}},
		{"burst-64x1K", func(ctx context.Context) error {
			ictx := comm.IssuerWaits(ctx)
			for i, s := range smalls {
				b := comm.Float32s(s)
				hs[i] = c.AllReduce(ictx, b, b, comm.Sum)
			}
			return waitAll(ctx)
		}},
	}
	for _, extra := range extraRows {
		rows = append(rows, extra(c, smalls))
	}
	if rowFilter != "" {
		rows = slices.DeleteFunc(rows, func(rw row) bool { return !slices.Contains(strings.Split(rowFilter, ","), rw.name) })
	}
	times := make([][]float64, len(rows))
	for b := -1; b < blocks; b++ { // block -1 warms up
		for i, rw := range rows {
			if err := c.Barrier(ctx).Wait(ctx); err != nil {
				return err
			}
			start := time.Now()
			for range per {
				if err := rw.once(ctx); err != nil {
					return fmt.Errorf("%s: %w", rw.name, err)
				}
			}
			if b >= 0 {
				times[i] = append(times[i], float64(time.Since(start).Microseconds())/float64(per))
			}
		}
	}
	if c.Rank() == 0 {
		fmt.Printf("# %d ranks, links %v\n", c.Size(), c.LinkKinds())
		for i, rw := range rows {
			slices.Sort(times[i])
			fmt.Printf("row %s %.2f %d\n", rw.name, times[i][len(times[i])/2], len(times[i]))
		}
	}
	return nil
}
