// Command desyncdemo shows what gorun and comm do when ranks disagree or
// one rank is late. Run it under gorun:
//
//	gorun -np 4 desyncdemo -mode desync    # ranks 2-3 Broadcast while 0-1 AllReduce at call #4
//	gorun -np 4 desyncdemo -mode late      # rank 3 reaches call #4 5 s late; the others name it
//
// In desync mode every rank fails within seconds with a DesyncError naming
// both calls, and gorun prints the ranks' merged flight records with the
// first disagreeing call marked. In late mode the job completes; SIGUSR2
// to gorun while it waits prints the flight-record table.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/rank"
)

func main() { os.Exit(run()) }

func run() int {
	mode := flag.String("mode", "desync", "desync or late")
	delay := flag.Duration("delay", 5*time.Second, "late mode: how late the last rank is")
	flag.Parse()
	if *mode != "desync" && *mode != "late" {
		fmt.Fprintf(os.Stderr, "desyncdemo: -mode %q: want desync or late\n", *mode)
		return 2
	}
	log := consolelog.New(os.Stderr, zerolog.WarnLevel)
	opts := rank.DefaultOptions()
	opts.Logger = log
	ctx := context.Background()
	r, err := rank.Init(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "desyncdemo: %v\n", err)
		return 1
	}
	c := r.Comm()
	me, n := c.Rank(), c.Size()
	buf := make([]float32, 16)
	err = nil
	for i := 1; i <= 5 && err == nil; i++ {
		b := comm.Float32s(buf)
		switch {
		case i == 4 && *mode == "desync" && me >= n/2:
			err = c.Broadcast(ctx, b, b, 0).Wait(ctx)
		case i == 4 && *mode == "late" && me == n-1:
			time.Sleep(*delay)
			fallthrough
		default:
			err = c.AllReduce(ctx, b, b, comm.Sum).Wait(ctx)
		}
	}
	var de *comm.DesyncError
	if errors.As(err, &de) {
		fmt.Printf("rank %d: DesyncError: %v\n", me, de)
		r.Abort(err)
		_ = r.Close()
		return 3
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "desyncdemo: rank %d: %v\n", me, err)
		r.Abort(err)
		_ = r.Close()
		return 1
	}
	if err := r.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "desyncdemo: rank %d: %v\n", me, err)
		return 1
	}
	fmt.Printf("rank %d: ok\n", me)
	return 0
}
