package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/bench"
	"github.com/gorun-hpc/gorun/internal/consolelog"
)

// benchMain is `gorun bench ...`: one rank of the collective benchmark (or,
// with "report", the comparison of result files). Exit codes: 0 success,
// 1 a failed run or wrong results, 2 a bad command line.
func benchMain(args []string, stdout, stderr io.Writer) int {
	o, err := bench.ParseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun bench: %s; see gorun bench --help\n", strings.TrimPrefix(err.Error(), "bench: "))
		return exitUsage
	}
	o.Config.Version = version
	// Warnings of the runtime underneath (an unprotected job secret, a
	// shared-memory fallback) go to the rank's stderr, which the launcher
	// forwards; routine events stay quiet so the table is what one reads.
	o.Config.Logger = consolelog.New(stderr, zerolog.WarnLevel)
	// SIGTERM from the launcher (another rank failed) or Ctrl-C ends the
	// sweep through the collectives' context: comm then fails the calls of
	// every rank instead of leaving peers waiting.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = bench.Execute(ctx, o, stdout, stderr)
	var ue *bench.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "gorun bench: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "gorun bench: %v\n", err)
	return exitFailure
}
