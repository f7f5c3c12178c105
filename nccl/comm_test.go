package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// enc and dec convert small exact values to and from dt's bytes.
func enc(dt comm.DType, v []float64) []byte {
	b := make([]byte, len(v)*dt.Size())
	for i, x := range v {
		switch dt {
		case comm.Float32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
		case comm.Float64:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
		case comm.BFloat16:
			binary.LittleEndian.PutUint16(b[2*i:], uint16(comm.BF16(float32(x))))
		case comm.Float16:
			binary.LittleEndian.PutUint16(b[2*i:], uint16(comm.F16(float32(x))))
		case comm.Int32:
			binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(x)))
		case comm.Int64:
			binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(x)))
		case comm.Uint8:
			b[i] = uint8(x)
		}
	}
	return b
}

func dec(dt comm.DType, b []byte) []float64 {
	v := make([]float64, len(b)/dt.Size())
	for i := range v {
		switch dt {
		case comm.Float32:
			v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case comm.Float64:
			v[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		case comm.BFloat16:
			v[i] = float64(comm.BFloat16Bits(binary.LittleEndian.Uint16(b[2*i:])).Float32())
		case comm.Float16:
			v[i] = float64(comm.Float16Bits(binary.LittleEndian.Uint16(b[2*i:])).Float32())
		case comm.Int32:
			v[i] = float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		case comm.Int64:
			v[i] = float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
		case comm.Uint8:
			v[i] = float64(b[i])
		}
	}
	return v
}

// input is rank r's element i: small positive integers, exact in every
// dtype and in every reduction of up to 4 ranks.
func input(r, i int) float64 { return float64((r+1)*(i%3+1)%5 + 1) }

func inputs(r, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = input(r, i)
	}
	return v
}

func upload(t *testing.T, c *Comm, dt comm.DType, v []float64) *DeviceBuffer {
	t.Helper()
	b, err := c.Device().Alloc(dt, len(v))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	if err := b.CopyFrom(enc(dt, v)); err != nil {
		t.Fatal(err)
	}
	return b
}

func download(t *testing.T, b *DeviceBuffer) []float64 {
	t.Helper()
	out := make([]byte, b.Len()*b.DType().Size())
	if err := b.CopyTo(out); err != nil {
		t.Fatal(err)
	}
	return dec(b.DType(), out)
}

func fold(op comm.Op, dt comm.DType, vals []float64) float64 {
	acc := vals[0]
	for _, x := range vals[1:] {
		switch op {
		case comm.Sum, comm.Avg:
			acc += x
		case comm.Prod:
			acc *= x
		case comm.Max:
			acc = max(acc, x)
		case comm.Min:
			acc = min(acc, x)
		}
	}
	if op == comm.Avg {
		acc /= float64(len(vals))
		switch dt {
		case comm.Int32, comm.Int64, comm.Uint8:
			acc = math.Trunc(acc)
		case comm.BFloat16:
			acc = float64(comm.BF16(float32(acc)).Float32())
		case comm.Float16:
			acc = float64(comm.F16(float32(acc)).Float32())
		case comm.Float32:
			acc = float64(float32(acc))
		}
	}
	return acc
}

// onAll runs f on every rank concurrently and fails the test with the
// ranks' errors.
func onAll(t *testing.T, cs []*Comm, f func(r int, c *Comm) error) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func wait(h comm.Handle) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return h.Wait(ctx)
}

func TestAllReduceEveryDTypeAndOp(t *testing.T) {
	const n, count = 3, 1000
	cs, _ := startComms(t, n, testConfig())
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			for _, inPlace := range []bool{false, true} {
				name := fmt.Sprintf("%v/%v/inplace=%v", dt, op, inPlace)
				var mu sync.Mutex
				got := make([][]float64, n)
				onAll(t, cs, func(r int, c *Comm) error {
					send := upload(t, c, dt, inputs(r, count))
					recv := send
					if !inPlace {
						recv = upload(t, c, dt, make([]float64, count))
					}
					if err := wait(c.AllReduce(context.Background(), send, recv, op)); err != nil {
						return err
					}
					v := download(t, recv)
					mu.Lock()
					got[r] = v
					mu.Unlock()
					return nil
				})
				if t.Failed() {
					t.Fatalf("%s failed", name)
				}
				for r := range n {
					for i := range count {
						vals := make([]float64, n)
						for q := range n {
							vals[q] = input(q, i)
						}
						if want := fold(op, dt, vals); got[r][i] != want {
							t.Fatalf("%s: rank %d element %d = %v, want %v", name, r, i, got[r][i], want)
						}
					}
				}
			}
		}
	}
}

func TestCollectives(t *testing.T) {
	const n, count = 4, 300 // count elements per rank block
	cs, _ := startComms(t, n, testConfig())
	ctx := context.Background()
	dt := comm.BFloat16
	cases := []struct {
		name string
		run  func(r int, c *Comm) ([]float64, error)
		want func(r, i int) (float64, bool) // false: element not checked
		size int                            // elements checked
	}{
		{"AllGather", func(r int, c *Comm) ([]float64, error) {
			send, recv := upload(t, c, dt, inputs(r, count)), upload(t, c, dt, make([]float64, n*count))
			err := wait(c.AllGather(ctx, send, recv))
			return download(t, recv), err
		}, func(r, i int) (float64, bool) { return input(i/count, i%count), true }, n * count},
		{"ReduceScatter", func(r int, c *Comm) ([]float64, error) {
			send, recv := upload(t, c, dt, inputs(r, n*count)), upload(t, c, dt, make([]float64, count))
			err := wait(c.ReduceScatter(ctx, send, recv, comm.Sum))
			return download(t, recv), err
		}, func(r, i int) (float64, bool) {
			s := 0.0
			for q := range n {
				s += input(q, r*count+i)
			}
			return s, true
		}, count},
		{"Broadcast", func(r int, c *Comm) ([]float64, error) {
			send, recv := upload(t, c, dt, inputs(r, count)), upload(t, c, dt, make([]float64, count))
			err := wait(c.Broadcast(ctx, send, recv, 2))
			return download(t, recv), err
		}, func(r, i int) (float64, bool) { return input(2, i), true }, count},
		{"Reduce", func(r int, c *Comm) ([]float64, error) {
			send, recv := upload(t, c, dt, inputs(r, count)), upload(t, c, dt, make([]float64, count))
			err := wait(c.Reduce(ctx, send, recv, comm.Max, 1))
			return download(t, recv), err
		}, func(r, i int) (float64, bool) {
			m := 0.0
			for q := range n {
				m = max(m, input(q, i))
			}
			return m, r == 1
		}, count},
		{"AllToAll", func(r int, c *Comm) ([]float64, error) {
			v := make([]float64, n*count)
			for i := range v {
				v[i] = float64(r*10 + i/count) // block p of rank r: 10r+p
			}
			send, recv := upload(t, c, dt, v), upload(t, c, dt, make([]float64, n*count))
			err := wait(c.AllToAll(ctx, send, recv))
			return download(t, recv), err
		}, func(r, i int) (float64, bool) { return float64((i/count)*10 + r), true }, n * count},
		{"AllToAllV", func(r int, c *Comm) ([]float64, error) {
			// rank r sends p+1 elements of value 10r+p to rank p
			sc, rc := make([]int, n), make([]int, n)
			var v []float64
			for p := range n {
				sc[p], rc[p] = p+1, r+1
				for range p + 1 {
					v = append(v, float64(10*r+p))
				}
			}
			send, recv := upload(t, c, dt, v), upload(t, c, dt, make([]float64, n*(r+1)))
			err := wait(c.AllToAllV(ctx, send, sc, recv, rc))
			return download(t, recv), err
		}, func(r, i int) (float64, bool) { return float64(10*(i/(r+1)) + r), i < n*(r+1) }, n * count},
		{"SendRecvRing", func(r int, c *Comm) ([]float64, error) {
			// Even ranks send first, odd ranks receive first: blocking
			// order that works on NCCL's in-order streams.
			buf, got := upload(t, c, dt, inputs(r, count)), upload(t, c, dt, make([]float64, count))
			next, prev := (r+1)%n, (r+n-1)%n
			var hs []comm.Handle
			if r%2 == 0 {
				hs = append(hs, c.Send(ctx, buf, next), c.Recv(ctx, got, prev))
			} else {
				hs = append(hs, c.Recv(ctx, got, prev), c.Send(ctx, buf, next))
			}
			for _, h := range hs {
				if err := wait(h); err != nil {
					return nil, err
				}
			}
			return download(t, got), nil
		}, func(r, i int) (float64, bool) { return input((r+n-1)%n, i), true }, count},
		{"Barrier", func(r int, c *Comm) ([]float64, error) { return nil, wait(c.Barrier(ctx)) }, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := make([][]float64, n)
			var mu sync.Mutex
			onAll(t, cs, func(r int, c *Comm) error {
				v, err := tc.run(r, c)
				mu.Lock()
				got[r] = v
				mu.Unlock()
				return err
			})
			for r := range n {
				for i := 0; i < tc.size && i < len(got[r]); i++ {
					if want, ok := tc.want(r, i); ok && got[r][i] != want {
						t.Fatalf("rank %d element %d = %v, want %v", r, i, got[r][i], want)
					}
				}
			}
		})
	}
	for r, c := range cs {
		if err := c.Close(); err != nil {
			t.Errorf("rank %d: Close: %v", r, err)
		}
	}
}

func TestInvalidCallsFailTheCommunicator(t *testing.T) {
	cases := []struct {
		name string
		call func(c *Comm, dev *DeviceBuffer) comm.Handle
		want string
	}{
		{"host buffer", func(c *Comm, d *DeviceBuffer) comm.Handle {
			return c.AllReduce(context.Background(), comm.Float32s(make([]float32, 4)), d, comm.Sum)
		}, "not in device memory"},
		{"length mismatch", func(c *Comm, d *DeviceBuffer) comm.Handle {
			s, _ := d.Slice(0, 2)
			return c.AllReduce(context.Background(), s, d, comm.Sum)
		}, "send has 2 elements, recv 4"},
		{"bad root", func(c *Comm, d *DeviceBuffer) comm.Handle { return c.Broadcast(context.Background(), d, d, 7) }, "root 7"},
		{"self send", func(c *Comm, d *DeviceBuffer) comm.Handle { return c.Send(context.Background(), d, c.Rank()) }, "peer 0"},
		{"bad op", func(c *Comm, d *DeviceBuffer) comm.Handle {
			return c.AllReduce(context.Background(), d, d, comm.Op(42))
		}, "invalid op"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs, _ := startComms(t, 1, testConfig())
			c := cs[0]
			d := upload(t, c, comm.Float32, make([]float64, 4))
			err := wait(tc.call(c, d))
			if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidArgument mentioning %q", err, tc.want)
			}
			// Poisoned: the next call fails the same way.
			if err2 := wait(c.Barrier(context.Background())); !errors.Is(err2, comm.ErrInvalidArgument) {
				t.Fatalf("next call: %v, want the same failure", err2)
			}
		})
	}
}

// In place, an exchange's sends would read blocks its receives overwrite
// (NCCL gives grouped sends and receives no order), so the communicator
// stages the input; blocks larger than the stand-in's 256 KiB rings make
// the overlap bite.
func TestAllToAllInPlace(t *testing.T) {
	const n, count = 3, 100_000 // float32: 400 KB a block
	cs, _ := startComms(t, n, testConfig())
	onAll(t, cs, func(r int, c *Comm) error {
		v := make([]float64, n*count)
		for i := range v {
			v[i] = float64(r*1000 + (i/count)*10 + i%7)
		}
		b := upload(t, c, comm.Float32, v)
		if err := wait(c.AllToAll(context.Background(), b, b)); err != nil {
			return err
		}
		for i, x := range download(t, b) {
			// Block p came from rank p's block r.
			if want := float64((i/count)*1000 + r*10 + (r*count+i%count)%7); x != want {
				return fmt.Errorf("element %d = %v, want %v", i, x, want)
			}
		}
		return nil
	})
}
