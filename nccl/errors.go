package nccl

import (
	"errors"
	"fmt"
	"os"
)

// Sentinels. Errors from this package wrap one of these or one of comm's
// (comm.ErrPeerLost, comm.ErrAborted, comm.ErrClosed, comm.ErrInvalidArgument),
// so code written against comm's contract classifies them the same way.
var (
	// ErrNoLibrary: libnccl.so.2 or the driver's libcuda.so.1 cannot be
	// loaded, or lacks a function this package calls.
	ErrNoLibrary = errors.New("nccl: library not available")
	// ErrNoDevice: the driver loaded but there is no usable CUDA device.
	ErrNoDevice = errors.New("nccl: no CUDA device")
	// ErrVersion: the NCCL found is older than LibraryConfig.MinVersion.
	ErrVersion = errors.New("nccl: NCCL too old")
	// ErrHostBuffer: a host buffer given to the GPU communicator.
	ErrHostBuffer = errors.New("nccl: buffer is not in device memory")
)

// LoadError says which library could not be loaded (or which function it
// lacks) and why, in one line.
type LoadError struct {
	Library string // the name or path that was asked for
	What    string // what it is, e.g. "NCCL" or "the NVIDIA driver's CUDA library"
	Symbol  string // a missing function, when the library loaded
	Err     error  // the dynamic loader's error
}

func (e *LoadError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("nccl: %s (%s) has no function %s: %v", e.Library, e.What, e.Symbol, e.Err)
	}
	hint := ""
	if os.Getenv("LD_LIBRARY_PATH") == "" {
		hint = " (LD_LIBRARY_PATH is not set)"
	}
	return fmt.Sprintf("nccl: cannot load %s (%s): %v%s", e.Library, e.What, e.Err, hint)
}

func (e *LoadError) Unwrap() error { return ErrNoLibrary }

// NoDeviceError: the driver is there but reports no device (or not the one
// asked for).
type NoDeviceError struct {
	Reason  string // e.g. "cuInit: CUDA_ERROR_NO_DEVICE (100)"
	Visible string // CUDA_VISIBLE_DEVICES as this process saw it ("" = unset)
}

func (e *NoDeviceError) Error() string {
	vis := "unset"
	if e.Visible != "" {
		vis = fmt.Sprintf("%q", e.Visible)
	}
	return fmt.Sprintf("nccl: no CUDA device: %s (CUDA_VISIBLE_DEVICES %s)", e.Reason, vis)
}

func (e *NoDeviceError) Unwrap() error { return ErrNoDevice }

// VersionError: the NCCL loaded is older than required.
type VersionError struct {
	Library   string
	Have, Min Version
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("nccl: %s is NCCL %v; gorun needs %v or newer", e.Library, e.Have, e.Min)
}

func (e *VersionError) Unwrap() error { return ErrVersion }

// CUDAError is a failed CUDA driver call.
type CUDAError struct {
	Call string // e.g. "cuMemAlloc_v2"
	Code int    // CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY", when the driver knows it
}

func (e *CUDAError) Error() string {
	name := e.Name
	if name == "" {
		name = "CUDA error"
	}
	return fmt.Sprintf("nccl: %s: %s (%d)", e.Call, name, e.Code)
}

// Result is an ncclResult_t.
type Result int32

// NCCL's result codes.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
)

// NCCLError is a failed NCCL call, or an asynchronous error a communicator
// reported (Call is then "ncclCommGetAsyncError").
type NCCLError struct {
	Call   string // e.g. "ncclAllReduce"
	Result Result
	Text   string // ncclGetErrorString
	Last   string // ncclGetLastError: NCCL's own account, often the useful part
	Rank   int    // this rank in the communicator, -1 before it exists
}

func (e *NCCLError) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (ncclResult %d)", e.Call, e.Text, e.Result)
	if e.Rank >= 0 {
		s = fmt.Sprintf("nccl: rank %d: %s: %s (ncclResult %d)", e.Rank, e.Call, e.Text, e.Result)
	}
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}
