//go:build !nogpu

package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/nccl"
	"github.com/gorun-hpc/gorun/rank"
)

// This file is the benchmark's GPU side (--device cuda), through nccl.
// Building with -tags nogpu leaves it out (gpu_nogpu.go), and with it
// purego's dynamic loader: the binary is then fully static.

// openGPU loads NCCL and the CUDA driver, failing at once with one line
// naming what is missing.
func openGPU() error {
	_, err := nccl.Open(nccl.DefaultLibraryConfig())
	return err
}

// newGPUComm makes the NCCL communicator over the world, on the GPU of
// this local rank.
func newGPUComm(ctx context.Context, cfg Config, r *rank.Rank) (comm.Communicator, error) {
	boot, err := nccl.BootstrapFor(r.WorldGroup())
	if err != nil {
		return nil, err
	}
	ncfg := nccl.DefaultConfig()
	ncfg.Logger = cfg.Logger
	ncfg.LocalRank = r.LocalRank()
	return nccl.New(ctx, boot, ncfg)
}

// gpuBuffers are the device twins of the runner's host buffers, and the
// device-side check's expected output and wrong-element counter.
type gpuBuffers struct {
	dev                         *nccl.Device
	dsend, drecv, dwant, dwrong *nccl.DeviceBuffer
	want                        []byte // host staging of the expected output
}

// startGPU, when the measured communicator is an nccl.Comm, allocates the
// device buffers and puts every rank's GPU into the report's header. The
// returned function frees the buffers.
func (r *runner) startGPU(ctx context.Context, rep *Report, maxSend, maxBuf int64) (func(), error) {
	nc, ok := r.c.(*nccl.Comm)
	if !ok {
		return func() {}, nil
	}
	devs, err := r.deviceNames(ctx, nc)
	if err != nil {
		return nil, err
	}
	for i := range rep.Hosts {
		rep.Hosts[i].Device = devs[i]
	}
	g := &gpuBuffers{dev: nc.Device(), want: alignedBytes(maxBuf)}
	free := func() {
		for _, b := range []*nccl.DeviceBuffer{g.dsend, g.drecv, g.dwant, g.dwrong} {
			if b != nil {
				_ = b.Free()
			}
		}
	}
	es, dt := int64(r.es), r.cfg.DType
	for _, a := range []struct {
		dst **nccl.DeviceBuffer
		dt  comm.DType
		n   int64
	}{{&g.dsend, dt, maxSend / es}, {&g.drecv, dt, maxBuf / es}, {&g.dwant, dt, maxBuf / es}, {&g.dwrong, comm.Int64, 1}} {
		if *a.dst, err = g.dev.Alloc(a.dt, int(a.n)); err != nil {
			free()
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	r.gpu = g
	return free, nil
}

// deviceNames gathers every rank's GPU ("0 [NVIDIA H100 ...]") for the
// header, over the control communicator, in fixed 128-byte slots.
func (r *runner) deviceNames(ctx context.Context, nc *nccl.Comm) ([]string, error) {
	const slot = 128
	d := nc.Device()
	mine := make([]byte, slot)
	copy(mine[:slot-1], fmt.Sprintf("%d [%s]", d.Index, d.Name))
	all := make([]byte, slot*r.n)
	if err := r.ctl.AllGather(ctx, comm.Uint8s(mine), comm.Uint8s(all)).Wait(ctx); err != nil {
		return nil, fmt.Errorf("bench: gathering device names: %w", err)
	}
	out := make([]string, r.n)
	for i := range out {
		b := all[i*slot : (i+1)*slot]
		if k := bytes.IndexByte(b, 0); k >= 0 {
			b = b[:k]
		}
		out[i] = string(b)
	}
	return out, nil
}

// gpuView is the device twin of a part of r.send or r.recv.
func (r *runner) gpuView(b []byte) comm.Buffer {
	db, _ := r.deviceTwin(b)
	return db
}

// deviceTwin maps a part of r.send or r.recv to the same elements of the
// device buffers.
func (r *runner) deviceTwin(b []byte) (*nccl.DeviceBuffer, error) {
	g := r.gpu
	for _, p := range []struct {
		host []byte
		dev  *nccl.DeviceBuffer
	}{{r.send, g.dsend}, {r.recv, g.drecv}} {
		if len(p.host) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(p.host)))
		at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if at >= base && at+uintptr(len(b)) <= base+uintptr(len(p.host)) {
			off := int(at-base) / r.es
			return p.dev.Slice(off, off+len(b)/r.es)
		}
	}
	// Empty parts (a 0-byte row) need no memory.
	return g.dsend.Slice(0, 0)
}

// upload copies a part of the host staging into its device twin.
func (r *runner) upload(b []byte) error {
	db, err := r.deviceTwin(b)
	if err != nil {
		return err
	}
	return db.CopyFrom(b)
}

// gpuSendRecv is nccl-tests' sendrecv on a GPU: one NCCL group of the send
// to the next rank and the receive from the previous one. Nil when the
// communicator is not NCCL's.
func (r *runner) gpuSendRecv(ctx context.Context, send, recv comm.Buffer) comm.Handle {
	nc, ok := r.c.(*nccl.Comm)
	if !ok {
		return nil
	}
	g := nc.Group()
	g.Send(send, (r.me+1)%r.n)
	g.Recv(recv, (r.me+r.n-1)%r.n)
	return g.Issue(ctx)[1]
}

// gpuCorrupt applies the test hook to the output in device memory.
func (r *runner) gpuCorrupt(me int, inPlace bool, recv []byte) error {
	db, err := r.deviceTwin(recv)
	if err != nil {
		return err
	}
	if err := db.CopyTo(recv); err != nil {
		return err
	}
	r.corrupt(me, inPlace, recv)
	return db.CopyFrom(recv)
}

// countWrongOnDevice is the device-side check: the expected output goes up
// once, and a kernel compares it with the output bitwise and counts the
// differing elements on the GPU, so the output itself never comes down.
func (r *runner) countWrongOnDevice(recv []byte, count int, expect func(int) float64) (int64, error) {
	g := r.gpu
	want := g.want[:len(recv)]
	for j := range count {
		r.io.set(want, j, expect(j))
	}
	got, err := r.deviceTwin(recv)
	if err != nil {
		return 0, err
	}
	dwant, err := g.dwant.Slice(0, count)
	if err != nil {
		return 0, err
	}
	if err := dwant.CopyFrom(want); err != nil {
		return 0, err
	}
	if err := g.dwrong.Zero(); err != nil {
		return 0, err
	}
	// The legacy default stream: the collective was waited for, and the
	// synchronous copies above ran on it.
	if err := g.dev.CountWrong(0, got, dwant, g.dwrong); err != nil {
		return 0, err
	}
	if err := g.dev.Synchronize(0); err != nil {
		return 0, err
	}
	var n [8]byte
	if err := g.dwrong.CopyTo(n[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(n[:])), nil
}
