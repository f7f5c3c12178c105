package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gorun-hpc/gorun/launcher"
)

// hostAgentMain is `gorun agent ...`: the per-host agent of a multi-host job,
// started by gorun itself over ssh or srun; not meant for users.
func hostAgentMain(args []string, stdout, stderr io.Writer) int {
	o, err := launcher.ParseHostAgentArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	o.Version = version
	return launcher.HostAgentMain(o, os.Stdin, stderr)
}
