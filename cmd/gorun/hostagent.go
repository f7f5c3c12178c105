package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gorun-hpc/gorun/launcher"
	"github.com/gorun-hpc/gorun/launcher/hostagent"
)

// hostAgentMain is `gorun agent ...`: the per-host agent of a multi-host job,
// started by gorun itself over ssh or srun; not meant for users.
func hostAgentMain(args []string, stdout, stderr io.Writer) int {
	o, err := hostagent.ParseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	o.Version = version
	// Doctor's GPUS column counts as the launcher does (launcher.GPUProbe,
	// the CUDA driver in a gorun with the GPU side).
	o.CountGPUs = launcher.DetectGPUs
	return hostagent.Main(o, os.Stdin, stderr)
}
