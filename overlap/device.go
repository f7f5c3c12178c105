package overlap

import (
	"context"
	"errors"
	"fmt"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
)

// DeviceComm is a Comm whose buffers live in device memory and whose calls
// run on a stream of their own (nccl.Comm). For a group with one, the
// executor keeps that group's fused buffers in device memory, packs and
// scatters with copies queued on the communicator's stream, and turns a
// Wait into the compute stream waiting for the collective (and its
// scatter) on the device, without blocking the CPU.
//
// "The compute stream" is the one the call context names (nccl.WithStream)
// or the communicator's default: the stream the program's kernels run on.
type DeviceComm interface {
	Comm
	// AllocDevice returns bytes of uninitialized device memory (a raw
	// buffer of bytes; ViewDevice types it).
	AllocDevice(bytes int64) (comm.Buffer, error)
	// FreeDevice releases a buffer from AllocDevice once the work queued on
	// the communicator's stream so far, which may still read or write it,
	// has run.
	FreeDevice(b comm.Buffer) error
	// ViewDevice returns bytes [off, off+bytes) of device buffer b as a
	// buffer of dt, sharing b's memory.
	ViewDevice(b comm.Buffer, dt comm.DType, off, bytes int64) (comm.Buffer, error)
	// CopyDevice queues segs on the communicator's stream, after the work
	// queued on the compute stream so far and after every call issued
	// before it, and returns a handle that completes when they have run.
	// It does not block. A Segment whose Src is nil zeroes its bytes.
	CopyDevice(ctx context.Context, segs []Segment) Handle
	// WaitOnDevice makes the compute stream wait for h (a handle from this
	// communicator) without blocking the CPU: kernels queued after it see
	// h's results.
	WaitOnDevice(ctx context.Context, h Handle) error
	// UploadDevice and DownloadDevice copy between host bytes and a device
	// buffer, synchronously (the plan-hash exchange's 8 bytes).
	UploadDevice(dst comm.Buffer, src []byte) error
	DownloadDevice(dst []byte, src comm.Buffer) error
}

// Segment is one device copy: Bytes bytes from Src at SrcOff to Dst at
// DstOff, or zeroes when Src is nil.
type Segment struct {
	Dst    comm.Buffer
	DstOff int64
	Src    comm.Buffer
	SrcOff int64
	Bytes  int64
}

// seg is one run of a member's bytes and where it sits in the fused buffer:
// pack copies member → fused, unpack fused → member. The layouts (see the
// package comment) are written once, here, and applied by the host path
// (copy) and the device path (queued copies) alike.
type seg struct{ fused, member, n int64 }

// packSegs is where member mi's input goes in the fused send buffer.
func (b *bucket) packSegs(mi int) []seg {
	m := b.b.Members[mi]
	if b.b.Op == buckets.ReduceScatter || b.b.Op == buckets.AllToAll {
		// Rank-major: block p gets the member's p-th slice at Offset/n
		// (for all_to_all, block p is what goes to rank p).
		blk, sl, off := b.b.Bytes/b.n, m.Bytes/b.n, m.Offset/b.n
		s := make([]seg, b.n)
		for p := range b.n {
			s[p] = seg{fused: p*blk + off, member: p * sl, n: sl}
		}
		return s
	}
	return []seg{{fused: m.Offset, member: 0, n: m.Bytes}}
}

// unpackSegs is where member mi's output comes from in the fused receive
// buffer: an all-gather's result holds every rank's whole bucket one after
// the other, so a member's output is its slice of each; a reduce-scatter's
// holds this rank's block only, where each member has its n-th share at
// Offset/n; an all-to-all's block p came from rank p in the rank-major
// layout pack made; an all-reduce's result is the bucket itself.
func (b *bucket) unpackSegs(mi int) []seg {
	m := b.b.Members[mi]
	switch b.b.Op {
	case buckets.AllGather:
		s := make([]seg, b.n)
		for p := range b.n {
			s[p] = seg{fused: p*b.b.Bytes + m.Offset, member: p * m.Bytes, n: m.Bytes}
		}
		return s
	case buckets.ReduceScatter:
		return []seg{{fused: m.Offset / b.n, member: 0, n: m.Bytes / b.n}}
	case buckets.AllToAll:
		// Block p came from rank p in the layout pack wrote block p in:
		// the member's p-th slice goes back where pack took it from.
		return b.packSegs(mi)
	}
	return []seg{{fused: m.Offset, member: 0, n: m.Bytes}}
}

// devPool is a device group's fused memory: raw buffers from AllocDevice,
// handed out by best fit and taken back at the bucket's wait. It is per
// group, not shared like the host free list, because a dropped buffer may
// still be read by the scatter queued on its communicator's stream: a later
// bucket of the same group queues its pack behind that scatter on the same
// stream, while another group's stream would not be ordered after it.
type devPool struct {
	dc   DeviceComm
	free []comm.Buffer // raw, reusable
	all  []comm.Buffer // every allocation, freed at Close
}

func (p *devPool) get(m *fusedMem, dt comm.DType, n int64) (fusedDev, error) {
	best := -1
	for i, b := range p.free {
		if int64(b.Len()) >= n && (best < 0 || b.Len() < p.free[best].Len()) {
			best = i
		}
	}
	var raw comm.Buffer
	if best >= 0 {
		raw = p.free[best]
		p.free[best] = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	} else {
		var err error
		if raw, err = p.dc.AllocDevice(n); err != nil {
			return fusedDev{}, err
		}
		p.all = append(p.all, raw)
	}
	typed, err := p.dc.ViewDevice(raw, dt, 0, n)
	if err != nil {
		p.free = append(p.free, raw)
		return fusedDev{}, err
	}
	m.cur += n
	m.peak = max(m.peak, m.cur)
	return fusedDev{raw: raw, buf: typed, n: n}, nil
}

func (p *devPool) put(m *fusedMem, f fusedDev) {
	m.cur -= f.n
	p.free = append(p.free, f.raw)
}

// close frees every buffer the pool ever allocated (FreeDevice waits for
// the stream's queued work first).
func (p *devPool) close() error {
	var errs []error
	for _, b := range p.all {
		errs = append(errs, p.dc.FreeDevice(b))
	}
	p.all, p.free = nil, nil
	return errors.Join(errs...)
}

// fusedDev is a fused buffer in device memory: the pool's raw buffer and
// its typed view.
type fusedDev struct {
	raw, buf comm.Buffer
	n        int64
}

// deviceOf checks that buf is device memory of dt holding at least bytes,
// for a group whose communicator works on device memory.
func deviceOf(buf comm.Buffer, dt comm.DType, bytes int64, bucket, tensor, what string) error {
	if buf == nil {
		return fmt.Errorf("%w: bucket %q: tensor %q: nil %s buffer", ErrUsage, bucket, tensor, what)
	}
	if _, host := buf.Host(); host {
		return fmt.Errorf("%w: bucket %q: tensor %q: %s is in host memory, but the group's communicator works on device memory",
			ErrUsage, bucket, tensor, what)
	}
	if buf.DType() != dt {
		return fmt.Errorf("%w: bucket %q: tensor %q: %s is %s, plan says %s", ErrUsage, bucket, tensor, what, buf.DType(), dt)
	}
	if have := int64(buf.Len()) * int64(dt.Size()); have < bytes {
		return fmt.Errorf("%w: bucket %q: tensor %q: %s has %d bytes, plan needs %d", ErrUsage, bucket, tensor, what, have, bytes)
	}
	return nil
}

// devSegs turns segs into device copies between the fused buffer and a
// member's buffer, in the direction toFused says.
func devSegs(segs []seg, fused, member comm.Buffer, toFused bool) []Segment {
	out := make([]Segment, 0, len(segs))
	for _, s := range segs {
		if s.n == 0 {
			continue
		}
		if toFused {
			out = append(out, Segment{Dst: fused, DstOff: s.fused, Src: member, SrcOff: s.member, Bytes: s.n})
		} else {
			out = append(out, Segment{Dst: member, DstOff: s.member, Src: fused, SrcOff: s.fused, Bytes: s.n})
		}
	}
	return out
}

// openDevice makes g a device group: its pool and the plan-hash buffers.
func (g *group) openDevice(dc DeviceComm) error {
	g.dev, g.pool = dc, &devPool{dc: dc}
	for i, n := range []int64{8, 8 * int64(dc.Size())} {
		raw, err := g.pool.get(&fusedMem{}, comm.Int64, n)
		if err != nil {
			return fmt.Errorf("overlap: group %s: plan-check buffer: %w", g.name, err)
		}
		g.hashDev[i] = raw.buf
	}
	return nil
}

// closeDevices frees every device group's memory: the pools (fused
// buffers, View's slots, the plan-hash buffers).
func (ex *Executor) closeDevices() error {
	var errs []error
	for _, g := range ex.groups {
		if g.pool != nil {
			if err := g.pool.close(); err != nil {
				errs = append(errs, fmt.Errorf("overlap: group %s: freeing device memory: %w", g.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// segBytes is the bytes segs copy (StepMetrics.CopiedBytes).
func segBytes(ss []Segment) int64 {
	var n int64
	for _, s := range ss {
		n += s.Bytes
	}
	return n
}
