package comm

import (
	"fmt"
	"unsafe"
)

// Buffer is a typed run of elements that a collective reads or writes. Host
// buffers wrap Go slices without copying; a device backend (nccl) supplies its
// own implementation whose Host returns false, and this package's
// Communicator rejects those with ErrDeviceBuffer.
//
// A Buffer must not be read or written by the caller between issuing a call
// that uses it and that call's completion.
type Buffer interface {
	// DType is the element type. Safe for concurrent use.
	DType() DType
	// Len is the number of elements. Safe for concurrent use.
	Len() int
	// Host returns the elements as bytes when they live in host memory, and
	// false when the CPU cannot address them. Safe for concurrent use.
	Host() ([]byte, bool)
}

// hostBuffer is a Buffer over host memory.
type hostBuffer struct {
	dt DType
	b  []byte
}

var _ Buffer = hostBuffer{}

func (h hostBuffer) DType() DType         { return h.dt }
func (h hostBuffer) Len() int             { return len(h.b) / h.dt.Size() }
func (h hostBuffer) Host() ([]byte, bool) { return h.b, true }

func view[T any](s []T, dt DType) Buffer {
	if len(s) == 0 {
		return hostBuffer{dt: dt, b: []byte{}}
	}
	n := len(s) * int(unsafe.Sizeof(s[0]))
	return hostBuffer{dt: dt, b: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), n)}
}

// Float32s views s as a Buffer without copying.
func Float32s(s []float32) Buffer { return view(s, Float32) }

// Float64s views s as a Buffer without copying.
func Float64s(s []float64) Buffer { return view(s, Float64) }

// BFloat16s views s as a Buffer without copying.
func BFloat16s(s []BFloat16Bits) Buffer { return view(s, BFloat16) }

// Float16s views s as a Buffer without copying.
func Float16s(s []Float16Bits) Buffer { return view(s, Float16) }

// Int32s views s as a Buffer without copying.
func Int32s(s []int32) Buffer { return view(s, Int32) }

// Int64s views s as a Buffer without copying.
func Int64s(s []int64) Buffer { return view(s, Int64) }

// Uint8s views s as a Buffer without copying.
func Uint8s(s []uint8) Buffer { return view(s, Uint8) }

// Bytes views raw host memory as a Buffer of dt. len(b) must be a multiple of
// dt's size.
func Bytes(dt DType, b []byte) (Buffer, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, dt)
	}
	if len(b)%dt.Size() != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of %v", ErrInvalidArgument, len(b), dt)
	}
	return hostBuffer{dt: dt, b: b}, nil
}

// BytesN views n pieces of raw host memory, at(i) for each i < n, as
// Buffers of dt, in two allocations whatever n: Bytes boxes each Buffer
// on its own, which for a coalesced call from C of dozens of vectors was
// a measurable part of the call (notes/torch-backend.md). The first
// error of at, or a length that is not a whole number of dt, is returned
// naming the index.
func BytesN(dt DType, n int, at func(i int) ([]byte, error)) ([]Buffer, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, dt)
	}
	hs := make([]hostBuffer, n)
	bs := make([]Buffer, n)
	for i := range hs {
		b, err := at(i)
		if err != nil {
			return nil, err
		}
		if len(b)%dt.Size() != 0 {
			return nil, fmt.Errorf("%w: buffer %d: %d bytes is not a whole number of %v", ErrInvalidArgument, i, len(b), dt)
		}
		hs[i] = hostBuffer{dt: dt, b: b}
		bs[i] = &hs[i]
	}
	return bs, nil
}

// Alloc returns a zeroed host Buffer of n elements of dt.
func Alloc(dt DType, n int) Buffer {
	return hostBuffer{dt: dt, b: make([]byte, n*dt.Size())}
}

// Slice returns the elements [lo, hi) of a host buffer as a Buffer sharing
// its memory, e.g. one tensor's place inside a bucket.
func Slice(b Buffer, lo, hi int) (Buffer, error) {
	hb, ok := b.Host()
	if !ok {
		return nil, ErrDeviceBuffer
	}
	if lo < 0 || hi < lo || hi > b.Len() {
		return nil, fmt.Errorf("%w: slice [%d:%d] of %d elements", ErrInvalidArgument, lo, hi, b.Len())
	}
	es := b.DType().Size()
	return hostBuffer{dt: b.DType(), b: hb[lo*es : hi*es : hi*es]}, nil
}

// AsFloat32 returns the float32 elements of a host Float32 buffer.
func AsFloat32(b Buffer) []float32 { return asT[float32](b, Float32) }

// AsFloat64 returns the float64 elements of a host Float64 buffer.
func AsFloat64(b Buffer) []float64 { return asT[float64](b, Float64) }

func asT[T any](b Buffer, dt DType) []T {
	hb, ok := b.Host()
	if !ok || b.DType() != dt || len(hb) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(hb))), len(hb)/int(unsafe.Sizeof(z)))
}

// castBytes views a byte slice as []T; len(b) must be a multiple of T's size
// and b aligned for T (guaranteed for slices from this package's
// constructors and for Go allocations of at least 8 bytes).
func castBytes[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}
