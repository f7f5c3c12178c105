// Command standins builds the stand-in libnccl.so.2 and libcuda.so.1 into
// a directory (as the tests do), and with -ptx writes the device-side check
// kernel's PTX that gorun embeds, so that scripts/bench-gpu.sh --standin can
// run the whole GPU benchmark pipeline on a machine without a GPU, and
// assemble the PTX where ptxas exists.
//
//	go run ./nccl/nccltest/standins [-ptx FILE] DIR
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gorun-hpc/gorun/nccl"
	"github.com/gorun-hpc/gorun/nccl/nccltest"
)

func main() {
	ptx := flag.String("ptx", "", "also write the count-wrong kernel's PTX to `FILE`")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: standins [-ptx FILE] DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "standins:", err)
		os.Exit(1)
	}
	libs, err := nccltest.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "standins:", err)
		os.Exit(1)
	}
	if *ptx != "" {
		if err := os.WriteFile(*ptx, []byte(nccl.CountWrongPTX()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "standins:", err)
			os.Exit(1)
		}
	}
	fmt.Println(libs.Dir)
}
