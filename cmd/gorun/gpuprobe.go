//go:build !nogpu

package main

import (
	"context"

	"github.com/gorun-hpc/gorun/launcher"
	"github.com/gorun-hpc/gorun/nccl"
)

// In a gorun with the GPU side, a host's GPUs are the devices the CUDA
// driver shows through nccl/ (with CUDA_VISIBLE_DEVICES applied), which is
// what a rank's nccl.New will open: the default --gpus-per-host and
// doctor's GPUS column then agree with it by construction. No driver, or a
// driver without devices, is 0 GPUs.
func init() {
	launcher.GPUProbe = func(context.Context) int {
		names, err := nccl.DeviceNames(nccl.DefaultLibraryConfig().CUDA)
		if err != nil {
			return 0
		}
		return len(names)
	}
}
