package nccl

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// Stream is a CUstream (the same handle as the runtime's cudaStream_t). The
// zero Stream is the legacy default stream.
type Stream uintptr

// Event is a CUevent.
type Event uintptr

const (
	streamNonBlocking    = 0x1 // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream
	eventDisableTiming   = 0x2 // CU_EVENT_DISABLE_TIMING: the cheap kind, for ordering only
	maxKernelBlocks      = 1024
	kernelThreadsPerBloc = 256
)

// NewStream creates a stream that does not synchronize implicitly with the
// legacy default stream.
func (d *Device) NewStream() (Stream, error) {
	var s uintptr
	err := d.do(func() error {
		return d.lib.check("cuStreamCreate", call(d.lib.cu.streamCreate, uintptr(unsafe.Pointer(&s)), streamNonBlocking))
	})
	return Stream(s), err
}

// DestroyStream releases s after its work completes.
func (d *Device) DestroyStream(s Stream) error {
	return d.do(func() error { return d.lib.check("cuStreamDestroy_v2", call(d.lib.cu.streamDestroy, uintptr(s))) })
}

// Synchronize blocks until everything queued on s has run.
func (d *Device) Synchronize(s Stream) error {
	return d.do(func() error { return d.lib.check("cuStreamSynchronize", call(d.lib.cu.streamSynchronize, uintptr(s))) })
}

// NewEvent creates an event without timing.
func (d *Device) NewEvent() (Event, error) {
	var e uintptr
	err := d.do(func() error {
		return d.lib.check("cuEventCreate", call(d.lib.cu.eventCreate, uintptr(unsafe.Pointer(&e)), eventDisableTiming))
	})
	return Event(e), err
}

// DestroyEvent releases e.
func (d *Device) DestroyEvent(e Event) error {
	return d.do(func() error { return d.lib.check("cuEventDestroy_v2", call(d.lib.cu.eventDestroy, uintptr(e))) })
}

// Record marks e as reached when s gets to this point.
func (d *Device) Record(e Event, s Stream) error {
	return d.do(func() error { return d.lib.check("cuEventRecord", call(d.lib.cu.eventRecord, uintptr(e), uintptr(s))) })
}

// StreamWait makes s wait for e's latest record without blocking the CPU.
func (d *Device) StreamWait(s Stream, e Event) error {
	return d.do(func() error {
		return d.lib.check("cuStreamWaitEvent", call(d.lib.cu.streamWaitEvent, uintptr(s), uintptr(e), 0))
	})
}

// query reports whether e has been reached; the device must be bound.
func (d *Device) queryBound(e Event) (bool, error) {
	r := int(int32(call(d.lib.cu.eventQuery, uintptr(e))))
	switch r {
	case cudaSuccess:
		return true, nil
	case cudaErrorNotReady:
		return false, nil
	}
	return false, &CUDAError{Call: "cuEventQuery", Code: r, Name: d.lib.errName(r)}
}

// DeviceBuffer is a run of elements in device memory: a comm.Buffer whose
// Host is false. Only this package's Communicator accepts it.
type DeviceBuffer struct {
	dev   *Device
	ptr   uintptr
	dt    comm.DType
	n     int
	owner bool // Free releases the memory (false for a Slice)
}

var _ comm.Buffer = (*DeviceBuffer)(nil)

// DType is the element type.
func (b *DeviceBuffer) DType() comm.DType { return b.dt }

// Len is the number of elements.
func (b *DeviceBuffer) Len() int { return b.n }

// Host returns false: the CPU cannot address device memory.
func (b *DeviceBuffer) Host() ([]byte, bool) { return nil, false }

// Ptr is the device address (CUdeviceptr).
func (b *DeviceBuffer) Ptr() uintptr { return b.ptr }

// Device is where the memory lives.
func (b *DeviceBuffer) Device() *Device { return b.dev }

// Alloc returns n elements of dt in device memory (uninitialized).
func (d *Device) Alloc(dt comm.DType, n int) (*DeviceBuffer, error) {
	if !dt.Valid() || n < 0 {
		return nil, fmt.Errorf("%w: alloc of %d %v", comm.ErrInvalidArgument, n, dt)
	}
	b := &DeviceBuffer{dev: d, dt: dt, n: n, owner: true}
	if n == 0 {
		return b, nil // cuMemAlloc rejects 0 bytes; nothing will read it
	}
	err := d.do(func() error {
		return d.lib.check("cuMemAlloc_v2", call(d.lib.cu.memAlloc, uintptr(unsafe.Pointer(&b.ptr)), uintptr(n*dt.Size())))
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Free releases the memory of a buffer from Alloc. Idempotent.
func (b *DeviceBuffer) Free() error {
	if !b.owner || b.ptr == 0 {
		return nil
	}
	p := b.ptr
	b.ptr = 0
	return b.dev.do(func() error { return b.dev.lib.check("cuMemFree_v2", call(b.dev.lib.cu.memFree, p)) })
}

// Slice returns elements [lo, hi) sharing b's memory (e.g. one tensor in a
// bucket). Freeing the slice does nothing.
func (b *DeviceBuffer) Slice(lo, hi int) (*DeviceBuffer, error) {
	if lo < 0 || hi < lo || hi > b.n {
		return nil, fmt.Errorf("%w: slice [%d:%d] of %d elements", comm.ErrInvalidArgument, lo, hi, b.n)
	}
	return &DeviceBuffer{dev: b.dev, ptr: b.ptr + uintptr(lo*b.dt.Size()), dt: b.dt, n: hi - lo}, nil
}

// CopyFrom copies host bytes into the buffer (synchronous, after the work
// queued on the legacy default stream). len(src) must be the buffer's size.
func (b *DeviceBuffer) CopyFrom(src []byte) error {
	if len(src) != b.n*b.dt.Size() {
		return fmt.Errorf("%w: copying %d bytes into a %d-byte device buffer", comm.ErrInvalidArgument, len(src), b.n*b.dt.Size())
	}
	if len(src) == 0 {
		return nil
	}
	defer runtime.KeepAlive(src)
	return b.dev.do(func() error {
		return b.dev.lib.check("cuMemcpyHtoD_v2", call(b.dev.lib.cu.memcpyHtoD, b.ptr, uintptr(unsafe.Pointer(&src[0])), uintptr(len(src))))
	})
}

// CopyTo copies the buffer into host bytes (synchronous, as CopyFrom).
func (b *DeviceBuffer) CopyTo(dst []byte) error {
	if len(dst) != b.n*b.dt.Size() {
		return fmt.Errorf("%w: copying a %d-byte device buffer into %d bytes", comm.ErrInvalidArgument, b.n*b.dt.Size(), len(dst))
	}
	if len(dst) == 0 {
		return nil
	}
	defer runtime.KeepAlive(dst)
	return b.dev.do(func() error {
		return b.dev.lib.check("cuMemcpyDtoH_v2", call(b.dev.lib.cu.memcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), b.ptr, uintptr(len(dst))))
	})
}

// Zero sets every byte to 0 (synchronous).
func (b *DeviceBuffer) Zero() error {
	if b.n == 0 {
		return nil
	}
	return b.dev.do(func() error {
		return b.dev.lib.check("cuMemsetD8_v2", call(b.dev.lib.cu.memsetD8, b.ptr, 0, uintptr(b.n*b.dt.Size())))
	})
}

// countWrongPTX is the device-side check of `gorun bench --device cuda`: for
// elements of 1, 2, 4 and 8 bytes, count the i where got[i] != want[i]
// (bitwise) with a grid-stride loop and add each thread's count to *count
// with one atomic. PTX is text the driver compiles for whatever GPU it runs
// on, so no CUDA compiler is needed to build gorun. Parameters: got, want,
// n (elements), count (a u64 in device memory).
var countWrongPTX = func() string {
	var sb strings.Builder
	sb.WriteString(".version 6.0\n.target sm_50\n.address_size 64\n")
	for _, k := range []struct {
		name, reg, ld string
		shift         int
	}{
		{"u8", "%rs", "u8", 0}, {"u16", "%rs", "u16", 1}, {"u32", "%r", "u32", 2}, {"u64", "%rd", "u64", 3},
	} {
		// Register classes: %rs are 16-bit (bytes load zero-extended), %r
		// 32-bit, %rd 64-bit; values compare at the register's width.
		cmp := map[string]string{"%rs": "u16", "%r": "u32", "%rd": "u64"}[k.reg]
		a, b := k.reg+"20", k.reg+"21"
		if k.reg == "%rd" {
			a, b = "%rd20", "%rd21"
		}
		fmt.Fprintf(&sb, `
.visible .entry gorun_count_wrong_%[1]s(
	.param .u64 p_got,
	.param .u64 p_want,
	.param .u64 p_n,
	.param .u64 p_count
)
{
	.reg .pred %%p<3>;
	.reg .b16 %%rs<24>;
	.reg .b32 %%r<24>;
	.reg .b64 %%rd<24>;

	ld.param.u64 %%rd1, [p_got];
	ld.param.u64 %%rd2, [p_want];
	ld.param.u64 %%rd3, [p_n];
	ld.param.u64 %%rd4, [p_count];
	cvta.to.global.u64 %%rd1, %%rd1;
	cvta.to.global.u64 %%rd2, %%rd2;
	cvta.to.global.u64 %%rd4, %%rd4;
	mov.u32 %%r1, %%ctaid.x;
	mov.u32 %%r2, %%ntid.x;
	mov.u32 %%r3, %%tid.x;
	mov.u32 %%r4, %%nctaid.x;
	mul.wide.u32 %%rd5, %%r1, %%r2;
	cvt.u64.u32 %%rd6, %%r3;
	add.u64 %%rd5, %%rd5, %%rd6;
	mul.wide.u32 %%rd7, %%r4, %%r2;
	mov.u64 %%rd8, 0;
LOOP:
	setp.ge.u64 %%p1, %%rd5, %%rd3;
	@%%p1 bra DONE;
	shl.b64 %%rd9, %%rd5, %[2]d;
	add.u64 %%rd10, %%rd1, %%rd9;
	add.u64 %%rd11, %%rd2, %%rd9;
	ld.global.%[3]s %[4]s, [%%rd10];
	ld.global.%[3]s %[5]s, [%%rd11];
	setp.ne.%[6]s %%p2, %[4]s, %[5]s;
	@%%p2 add.u64 %%rd8, %%rd8, 1;
	add.u64 %%rd5, %%rd5, %%rd7;
	bra LOOP;
DONE:
	setp.eq.u64 %%p1, %%rd8, 0;
	@%%p1 bra END;
	atom.global.add.u64 %%rd12, [%%rd4], %%rd8;
END:
	ret;
}
`, k.name, k.shift, k.ld, a, b, cmp)
	}
	return sb.String()
}()

// loadKernels JIT-loads countWrongPTX once per device.
func (d *Device) loadKernels() error {
	d.modOnce.Do(func() {
		d.modErr = d.do(func() error {
			src := append([]byte(countWrongPTX), 0)
			var mod uintptr
			if err := d.lib.check("cuModuleLoadData", call(d.lib.cu.moduleLoadData, uintptr(unsafe.Pointer(&mod)), uintptr(unsafe.Pointer(&src[0])))); err != nil {
				return err
			}
			runtime.KeepAlive(src)
			for i, n := range []string{"u8", "u16", "u32", "u64"} {
				name := append([]byte("gorun_count_wrong_"+n), 0)
				err := d.lib.check("cuModuleGetFunction", call(d.lib.cu.moduleGetFunction, uintptr(unsafe.Pointer(&d.kernels[i])), mod, uintptr(unsafe.Pointer(&name[0]))))
				runtime.KeepAlive(name)
				if err != nil {
					return err
				}
			}
			return nil
		})
	})
	return d.modErr
}

// CountWrong counts, on the device, the elements where got and want differ
// bitwise, queued on s after the work already there; counter is a device
// buffer of at least one Int64 that the count is added to. It does not
// block: read counter after s is synchronized.
func (d *Device) CountWrong(s Stream, got, want, counter *DeviceBuffer) error {
	if got.dt.Size() != want.dt.Size() || got.n != want.n || counter.n*counter.dt.Size() < 8 {
		return fmt.Errorf("%w: count-wrong over %d and %d elements", comm.ErrInvalidArgument, got.n, want.n)
	}
	if got.n == 0 {
		return nil
	}
	if err := d.loadKernels(); err != nil {
		return err
	}
	k := map[int]int{1: 0, 2: 1, 4: 2, 8: 3}[got.dt.Size()]
	blocks := min((got.n+kernelThreadsPerBloc-1)/kernelThreadsPerBloc, maxKernelBlocks)
	// cuLaunchKernel reads each parameter through a pointer; both the
	// values and the pointer array are Go memory handed to C, so they are
	// pinned for the call (the driver copies them before returning).
	args := &[4]uint64{uint64(got.ptr), uint64(want.ptr), uint64(got.n), uint64(counter.ptr)}
	params := &[4]unsafe.Pointer{unsafe.Pointer(&args[0]), unsafe.Pointer(&args[1]), unsafe.Pointer(&args[2]), unsafe.Pointer(&args[3])}
	var pin runtime.Pinner
	pin.Pin(args)
	pin.Pin(params)
	defer pin.Unpin()
	return d.do(func() error {
		return d.lib.check("cuLaunchKernel", call(d.lib.cu.launchKernel, d.kernels[k],
			uintptr(blocks), 1, 1, kernelThreadsPerBloc, 1, 1, 0, uintptr(s), uintptr(unsafe.Pointer(&params[0])), 0))
	})
}

// CountWrongPTX is the PTX text of the device-side check that `gorun bench
// --device cuda` loads (cuModuleLoadData), for assembling it offline with
// ptxas (scripts/bench-gpu.sh).
func CountWrongPTX() string { return countWrongPTX }
