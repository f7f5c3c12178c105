package comm_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// BenchmarkCoalesced measures a coalesced all-reduce of pieces small
// vectors (float32 sum, 2 ranks in this process over shared memory)
// against one all-reduce of their total size, the anchor the fused path
// is held to (notes/torch-backend.md): "one" is the anchor, "coalesced"
// the same bytes as 64 vectors in one call.
//
//	go test -run '^$' -bench Coalesced ./comm/
func BenchmarkCoalesced(b *testing.B) {
	const pieces, piece = 64, 256 // 64 x 1 KiB of float32
	j := newNetJob(b, 2, comm.DefaultConfig(), false)
	for _, shape := range []string{"one", "coalesced"} {
		b.Run(fmt.Sprintf("%s-%dx%dB", shape, pieces, piece*4), func(b *testing.B) {
			bufs := make([][]comm.Buffer, len(j.comms))
			for r := range bufs {
				if shape == "one" {
					bufs[r] = []comm.Buffer{comm.Float32s(make([]float32, pieces*piece))}
					continue
				}
				for range pieces {
					bufs[r] = append(bufs[r], comm.Float32s(make([]float32, piece)))
				}
			}
			call := func(r int) error {
				ctx := context.Background()
				if shape == "one" {
					return j.comms[r].AllReduce(ctx, bufs[r][0], bufs[r][0], comm.Sum).Wait(ctx)
				}
				return j.comms[r].AllReduceCoalesced(ctx, bufs[r], bufs[r], comm.Sum).Wait(ctx)
			}
			runPeers(b, len(j.comms), 5, call) // warm up
			b.ReportAllocs()
			b.ResetTimer()
			runPeers(b, len(j.comms), b.N, call)
			b.StopTimer()
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "us/op")
		})
	}
}

// runPeers runs call iters times on every rank at once, rank 0 on this
// goroutine, and returns once all have finished.
func runPeers(b *testing.B, n, iters int, call func(r int) error) {
	errs := make(chan error, n)
	for r := 1; r < n; r++ {
		go func() { // waited for through errs below
			for range iters {
				if err := call(r); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range iters {
		if err := call(0); err != nil {
			b.Fatal(err)
		}
	}
	for r := 1; r < n; r++ {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}

// TestBytesN: the views share the caller's memory, keep their lengths,
// and a bad piece is refused naming its index.
func TestBytesN(t *testing.T) {
	mem := [][]byte{make([]byte, 8), {}, make([]byte, 4)}
	bs, err := comm.BytesN(comm.Float32, len(mem), func(i int) ([]byte, error) { return mem[i], nil })
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bs {
		hb, ok := b.Host()
		if !ok || b.DType() != comm.Float32 || b.Len() != len(mem[i])/4 {
			t.Fatalf("buffer %d: host %v, %v, %d elements; want %d float32", i, ok, b.DType(), b.Len(), len(mem[i])/4)
		}
		if len(hb) > 0 && &hb[0] != &mem[i][0] {
			t.Fatalf("buffer %d is a copy, not a view", i)
		}
	}
	mem[2] = make([]byte, 6)
	if _, err := comm.BytesN(comm.Float32, len(mem), func(i int) ([]byte, error) { return mem[i], nil }); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "buffer 2") {
		t.Fatalf("6 bytes of float32: %v, want an invalid argument naming buffer 2", err)
	}
	bad := errors.New("no view")
	if _, err := comm.BytesN(comm.Float32, 3, func(i int) ([]byte, error) { return nil, bad }); !errors.Is(err, bad) {
		t.Fatalf("at's error: got %v", err)
	}
	if _, err := comm.BytesN(comm.DType(250), 1, func(int) ([]byte, error) { return nil, nil }); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("an invalid dtype: got %v", err)
	}
}
