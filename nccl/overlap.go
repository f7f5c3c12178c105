package nccl

import (
	"context"
	"fmt"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/overlap"
)

// Comm is an overlap.DeviceComm: an executor over it keeps its fused
// bucket buffers in device memory, packs and scatters with copies on the
// communicator's stream, and turns a wait into the compute stream waiting
// for the done event (see overlap.DeviceComm).
var _ overlap.DeviceComm = (*Comm)(nil)

// AllocDevice returns bytes of device memory as a raw Uint8 buffer.
func (c *Comm) AllocDevice(bytes int64) (comm.Buffer, error) {
	return c.dev.Alloc(comm.Uint8, int(bytes))
}

// FreeDevice frees a buffer from AllocDevice after the communicator's
// stream has run everything queued so far (a scatter may still read it);
// cuMemFree itself does not wait for a non-blocking stream. After Close the
// stream is gone and was drained first, so the memory is freed at once.
func (c *Comm) FreeDevice(b comm.Buffer) error {
	db, ok := b.(*DeviceBuffer)
	if !ok || db.dev != c.dev {
		return fmt.Errorf("%w: nccl: FreeDevice of a %T that is not this device's memory", comm.ErrInvalidArgument, b)
	}
	c.issueMu.Lock()
	var err error
	if !c.closed {
		err = c.dev.Synchronize(c.stream)
	}
	c.issueMu.Unlock()
	if ferr := db.Free(); err == nil {
		err = ferr
	}
	return err
}

// ViewDevice returns bytes [off, off+bytes) of b as a buffer of dt sharing
// its memory (a fused buffer's typed view, a tensor's slot in it).
func (c *Comm) ViewDevice(b comm.Buffer, dt comm.DType, off, bytes int64) (comm.Buffer, error) {
	db, ok := b.(*DeviceBuffer)
	if !ok {
		return nil, fmt.Errorf("%w: nccl: a view of a %T, not device memory", comm.ErrInvalidArgument, b)
	}
	es := int64(dt.Size())
	size := int64(db.n * db.dt.Size())
	if !dt.Valid() || off < 0 || bytes < 0 || off+bytes > size || off%es != 0 || bytes%es != 0 {
		return nil, fmt.Errorf("%w: nccl: view [%d, %d) as %v of a %d-byte buffer", comm.ErrInvalidArgument, off, off+bytes, dt, size)
	}
	return &DeviceBuffer{dev: db.dev, ptr: db.ptr + uintptr(off), dt: dt, n: int(bytes / es)}, nil
}

// CopyDevice queues segs on the communicator's stream as one issue: after
// the compute stream's queued work (the kernels that wrote the sources,
// or still read the destinations) and the calls issued before, with a done
// event behind them. Copies are cuMemcpyDtoDAsync, zeroes cuMemsetD8Async;
// they are never bracketed in an NCCL group. A bad segment fails the
// communicator, as a refused call does: the executor's bookkeeping is
// wrong, and the peers are waiting for a collective it will not issue.
func (c *Comm) CopyDevice(ctx context.Context, segs []overlap.Segment) comm.Handle {
	ls := make([]launch, 0, len(segs))
	for i, s := range segs {
		dst, err := c.segPtr(s.Dst, s.DstOff, s.Bytes)
		if err != nil {
			return c.refuse("copy %d: destination: %v", i, err)
		}
		if s.Src == nil {
			n := uintptr(s.Bytes)
			ls = append(ls, func(st uintptr) (string, Result) {
				return "cuMemsetD8Async", cudaResult(call(c.lib.cu.memsetD8Async, dst, 0, n, st))
			})
			continue
		}
		src, err := c.segPtr(s.Src, s.SrcOff, s.Bytes)
		if err != nil {
			return c.refuse("copy %d: source: %v", i, err)
		}
		n := uintptr(s.Bytes)
		ls = append(ls, func(st uintptr) (string, Result) {
			return "cuMemcpyDtoDAsync_v2", cudaResult(call(c.lib.cu.memcpyDtoDAsync, dst, src, n, st))
		})
	}
	if len(ls) == 0 {
		// Still an issue: the handle orders what follows after the
		// compute stream's work, as a copy would.
		ls = append(ls, func(uintptr) (string, Result) { return "", Success })
	}
	return c.issueAs(ctx, ls, false)[0]
}

// cudaResult maps a driver call's result into the launch convention: a
// failed copy reads as NCCL's "unhandled cuda error", named by its call.
func cudaResult(r uintptr) Result {
	if r != cudaSuccess {
		return UnhandledCudaError
	}
	return Success
}

// segPtr checks that [off, off+n) lies in b, device memory of this
// communicator's device, and returns its address.
func (c *Comm) segPtr(b comm.Buffer, off, n int64) (uintptr, error) {
	if b == nil {
		return 0, fmt.Errorf("nil buffer")
	}
	db, ok := b.(*DeviceBuffer)
	if !ok {
		if _, host := b.Host(); host {
			return 0, ErrHostBuffer
		}
		return 0, fmt.Errorf("%T is not an nccl.DeviceBuffer", b)
	}
	if db.dev != c.dev {
		return 0, fmt.Errorf("buffer is on device %d, the communicator on %d", db.dev.Index, c.dev.Index)
	}
	if size := int64(db.n * db.dt.Size()); off < 0 || n < 0 || off+n > size {
		return 0, fmt.Errorf("bytes [%d, %d) of a %d-byte buffer", off, off+n, size)
	}
	if db.n > 0 && db.ptr == 0 {
		return 0, fmt.Errorf("buffer was freed")
	}
	return db.ptr + uintptr(off), nil
}

// WaitOnDevice makes the compute stream of ctx (WithStream, or
// Config.ComputeStream) wait for h on the device (StreamWait).
func (c *Comm) WaitOnDevice(ctx context.Context, h comm.Handle) error {
	return StreamWait(h, c.computeStream(ctx))
}

// UploadDevice copies src into dst (synchronous).
func (c *Comm) UploadDevice(dst comm.Buffer, src []byte) error {
	db, ok := dst.(*DeviceBuffer)
	if !ok {
		return fmt.Errorf("%w: nccl: upload into a %T", comm.ErrInvalidArgument, dst)
	}
	return db.CopyFrom(src)
}

// DownloadDevice copies src into dst (synchronous).
func (c *Comm) DownloadDevice(dst []byte, src comm.Buffer) error {
	db, ok := src.(*DeviceBuffer)
	if !ok {
		return fmt.Errorf("%w: nccl: download from a %T", comm.ErrInvalidArgument, src)
	}
	return db.CopyTo(dst)
}
