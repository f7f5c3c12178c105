package main

import (
	"context"

	"github.com/gorun-hpc/gorun/comm"
)

func init() {
	extraRows = append(extraRows, func(c *comm.Comm, smalls [][]float32) row {
		bufs := make([]comm.Buffer, len(smalls))
		for i, s := range smalls {
			bufs[i] = comm.Float32s(s)
		}
		return row{"coalesced-64x1K", func(ctx context.Context) error {
			return c.AllReduceCoalesced(ctx, bufs, bufs, comm.Sum).Wait(ctx)
		}}
	})
}
