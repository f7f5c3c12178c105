//go:build nogpu

package bench

import (
	"context"
	"errors"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
)

// A gorun built with -tags nogpu has no GPU side: no nccl, no purego, a
// fully static binary. --device cuda then fails at once saying so.

var errNoGPUBuild = errors.New("this gorun was built with -tags nogpu, without GPU support")

func openGPU() error { return errNoGPUBuild }

func newGPUComm(context.Context, Config, *rank.Rank) (comm.Communicator, error) {
	return nil, errNoGPUBuild
}

// gpuBuffers is empty: runner.gpu stays nil and none of the methods below
// is reached.
type gpuBuffers struct{}

func (r *runner) startGPU(context.Context, *Report, int64, int64) (func(), error) {
	return func() {}, nil
}

func (r *runner) gpuView([]byte) comm.Buffer { return nil }

func (r *runner) upload([]byte) error { return errNoGPUBuild }

func (r *runner) gpuSendRecv(context.Context, comm.Buffer, comm.Buffer) comm.Handle { return nil }

func (r *runner) gpuCorrupt(int, bool, []byte) error { return errNoGPUBuild }

func (r *runner) countWrongOnDevice([]byte, int, func(int) float64) (int64, error) {
	return 0, errNoGPUBuild
}
