// Command rdzvbarrier is the smallest rank program: it forms the job's world
// through package rendezvous, prints it on one line, runs a barrier, leaves
// and exits 0. On any error it prints one line saying what went wrong and
// exits nonzero. It runs under gorun, under a torch-style launcher
// (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) or under srun, unchanged:
//
//	gorun -np 16 bin/rdzvbarrier
//
// It is also the rank program of the formation benchmark
// (scripts/bench-rdzv.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/rendezvous"
)

func main() { os.Exit(run()) }

func run() int {
	verbose := flag.Bool("v", false, "log rendezvous progress (info level)")
	rounds := flag.Int("barriers", 1, "number of barriers to run")
	quiet := flag.Bool("q", false, "do not print the world line")
	flag.Parse()

	cfg, err := rendezvous.ConfigFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdzvbarrier: %v\n", err)
		return 2
	}
	lvl := zerolog.WarnLevel
	if *verbose {
		lvl = zerolog.InfoLevel
	}
	cfg.Logger = consolelog.New(os.Stderr, lvl)

	// SIGTERM from the launcher (another rank failed) ends the wait cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w, err := rendezvous.Join(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdzvbarrier: rank %d: %v\n", cfg.Rank, err)
		return 1
	}
	if !*quiet {
		var b strings.Builder
		for r := range w.Size() {
			if r > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d:%s", r, w.Host(r))
		}
		fmt.Printf("rank %d/%d job %s epoch %d world [%s]\n", w.Rank(), w.Size(), w.JobID(), w.Epoch(), b.String())
	}
	for range *rounds {
		if err := w.Barrier(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "rdzvbarrier: rank %d: %v\n", w.Rank(), err)
			_ = w.Close()
			return 1
		}
	}
	if err := w.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "rdzvbarrier: rank %d: %v\n", w.Rank(), err)
		return 1
	}
	return 0
}
