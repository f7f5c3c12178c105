package nccl

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Version is an NCCL release.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// versionOf decodes ncclGetVersion's integer: X*10000+Y*100+Z from 2.9 on,
// X*1000+Y*100+Z before (NCCL_VERSION_CODE in nccl.h).
func versionOf(code int) Version {
	if code >= 10000 {
		return Version{code / 10000, code / 100 % 100, code % 100}
	}
	return Version{code / 1000, code / 100 % 10, code % 100}
}

// MinVersion is the oldest NCCL this package drives: 2.14 brought
// non-blocking communicators (ncclConfig_t.blocking), which is how a
// communicator that is still connecting can be aborted when a peer is lost;
// it also has ncclCommFinalize, ncclGetLastError, bfloat16 and ncclAvg.
var MinVersion = Version{2, 14, 0}

// LibraryConfig says which libraries to load.
type LibraryConfig struct {
	// NCCL is the NCCL library, a name the dynamic loader searches for
	// (LD_LIBRARY_PATH, the cache) or a path. "libnccl.so.2", NCCL's
	// soname; $GORUN_NCCL_LIBRARY overrides it in DefaultLibraryConfig, e.g.
	// to use the copy PyTorch's wheels bundle.
	NCCL string
	// CUDA is the NVIDIA driver's CUDA library. "libcuda.so.1", the name
	// every driver installs. The driver API is enough (NCCL carries its own
	// CUDA runtime), so no version-suffixed libcudart is needed.
	CUDA string
	// MinVersion is the oldest NCCL accepted; MinVersion by default.
	MinVersion Version
}

// DefaultLibraryConfig returns the sonames and MinVersion.
func DefaultLibraryConfig() LibraryConfig {
	c := LibraryConfig{NCCL: "libnccl.so.2", CUDA: "libcuda.so.1", MinVersion: MinVersion}
	if p := os.Getenv("GORUN_NCCL_LIBRARY"); p != "" {
		c.NCCL = p
	}
	return c
}

// Library is a loaded NCCL and CUDA driver. It stays loaded for the life of
// the process: NCCL starts threads that outlive any one call, so unloading it
// is never safe. Safe for concurrent use.
type Library struct {
	cfg     LibraryConfig
	Version Version // NCCL's
	Driver  int     // cuDriverGetVersion, e.g. 12040
	Devices int     // devices this process can see

	nc ncclFuncs
	cu cudaFuncs
	// initRankConfig passes the 128-byte ncclUniqueId by value, which only
	// purego's reflective call can lay out (on the stack, amd64 System V
	// MEMORY class; a copy passed by reference on arm64). The hot calls use
	// SyscallN instead: they take scalars only.
	initRankConfig func(comm *uintptr, nranks int32, id UniqueID, rank int32, cfg *commConfig) int32
	// The error texts are C strings; purego copies them into Go strings.
	errorString func(r int32) string
	lastError   func(comm uintptr) string
}

type ncclFuncs struct {
	getVersion, getUniqueID, getErrorString, getLastError                 uintptr
	commAbort, commDestroy, commFinalize, commGetAsyncError, commUserRank uintptr
	groupStart, groupEnd                                                  uintptr
	allReduce, allGather, reduceScatter, broadcast, reduce, send, recv    uintptr
}

type cudaFuncs struct {
	init, driverGetVersion, deviceGetCount, deviceGet, deviceGetName     uintptr
	primaryCtxRetain, primaryCtxRelease, ctxSetCurrent, getErrorName     uintptr
	memAlloc, memFree, memcpyHtoD, memcpyDtoH, memsetD8, memcpyDtoDAsync uintptr
	memsetD8Async                                                        uintptr
	streamCreate, streamDestroy, streamSynchronize, streamWaitEvent      uintptr
	eventCreate, eventDestroy, eventRecord, eventQuery, eventSynchronize uintptr
	moduleLoadData, moduleGetFunction, launchKernel                      uintptr
}

// UniqueID is ncclUniqueId: 128 opaque bytes made by one rank
// (ncclGetUniqueId) and handed to every rank of the communicator.
type UniqueID struct{ Internal [128]byte }

// commConfig is the head of ncclConfig_t as NCCL 2.14 defined it. NCCL
// copies min(size, its own sizeof) bytes and resets every field newer than
// `version` to its default, so this prefix is valid for every later release.
type commConfig struct {
	size     uint64
	magic    uint32
	version  uint32
	blocking int32
}

const (
	configMagic   = 0xcafebeef
	configVersion = 21400 // NCCL_VERSION(2,14,0)
	configSize    = 20    // through blocking; no padding read beyond it
)

var (
	libMu sync.Mutex
	libs  = map[LibraryConfig]*Library{}
)

const (
	cudaSuccess       = 0
	cudaErrorNoDevice = 100
	cudaErrorNotReady = 600
)

// Open loads the CUDA driver and NCCL named in cfg, checks that a device is
// there and that NCCL is at least cfg.MinVersion, and returns the library;
// the same *Library for the same cfg on later calls. It does the checks in
// the order a user fixes them: driver, device, NCCL, version. Its errors are
// one line naming what is missing: *LoadError, *NoDeviceError, *VersionError.
func Open(cfg LibraryConfig) (*Library, error) {
	libMu.Lock()
	defer libMu.Unlock()
	if l := libs[cfg]; l != nil {
		return l, nil
	}
	l := &Library{cfg: cfg}
	if err := l.loadCUDA(); err != nil {
		return nil, err
	}
	if err := l.loadNCCL(); err != nil {
		return nil, err
	}
	libs[cfg] = l
	return l, nil
}

// dlopen is purego.Dlopen on one OS thread. dlerror's message is per
// thread and purego reads it in a second call, so a goroutine moved to
// another thread in between reported an empty reason ("cannot load
// libcuda.so.1 (...): " and nothing after; seen in TestGPUPathEndToEnd).
func dlopen(name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// dlsym is purego.Dlsym on one OS thread, for dlerror as in dlopen.
func dlsym(h uintptr, name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlsym(h, name)
}

func sym(h uintptr, lib, what, name string, dst *uintptr) error {
	p, err := dlsym(h, name)
	if err != nil {
		return &LoadError{Library: lib, What: what, Symbol: name, Err: err}
	}
	*dst = p
	return nil
}

func (l *Library) loadCUDA() error {
	const what = "the NVIDIA driver's CUDA library"
	name := l.cfg.CUDA
	h, err := dlopen(name)
	if err != nil {
		return &LoadError{Library: name, What: what, Err: err}
	}
	c := &l.cu
	for _, s := range []struct {
		name string
		dst  *uintptr
	}{
		{"cuInit", &c.init}, {"cuDriverGetVersion", &c.driverGetVersion}, {"cuDeviceGetCount", &c.deviceGetCount},
		{"cuDeviceGet", &c.deviceGet}, {"cuDeviceGetName", &c.deviceGetName},
		{"cuDevicePrimaryCtxRetain", &c.primaryCtxRetain}, {"cuDevicePrimaryCtxRelease_v2", &c.primaryCtxRelease},
		{"cuCtxSetCurrent", &c.ctxSetCurrent}, {"cuGetErrorName", &c.getErrorName},
		{"cuMemAlloc_v2", &c.memAlloc}, {"cuMemFree_v2", &c.memFree}, {"cuMemcpyHtoD_v2", &c.memcpyHtoD},
		{"cuMemcpyDtoH_v2", &c.memcpyDtoH}, {"cuMemsetD8_v2", &c.memsetD8},
		{"cuMemcpyDtoDAsync_v2", &c.memcpyDtoDAsync}, {"cuMemsetD8Async", &c.memsetD8Async},
		{"cuStreamCreate", &c.streamCreate}, {"cuStreamDestroy_v2", &c.streamDestroy},
		{"cuStreamSynchronize", &c.streamSynchronize}, {"cuStreamWaitEvent", &c.streamWaitEvent},
		{"cuEventCreate", &c.eventCreate}, {"cuEventDestroy_v2", &c.eventDestroy}, {"cuEventRecord", &c.eventRecord},
		{"cuEventQuery", &c.eventQuery}, {"cuEventSynchronize", &c.eventSynchronize},
		{"cuModuleLoadData", &c.moduleLoadData}, {"cuModuleGetFunction", &c.moduleGetFunction},
		{"cuLaunchKernel", &c.launchKernel},
	} {
		if err := sym(h, name, what, s.name, s.dst); err != nil {
			return err
		}
	}
	var v int32
	call(c.driverGetVersion, uintptr(unsafe.Pointer(&v)))
	l.Driver = int(v)
	if r := int(call(c.init, 0)); r != cudaSuccess {
		if r == cudaErrorNoDevice {
			return &NoDeviceError{Reason: "cuInit: " + l.errName(r), Visible: os.Getenv("CUDA_VISIBLE_DEVICES")}
		}
		return &CUDAError{Call: "cuInit", Code: r, Name: l.errName(r)}
	}
	var n int32
	if err := l.check("cuDeviceGetCount", call(c.deviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return err
	}
	if n < 1 {
		return &NoDeviceError{Reason: "the driver reports 0 devices", Visible: os.Getenv("CUDA_VISIBLE_DEVICES")}
	}
	l.Devices = int(n)
	return nil
}

func (l *Library) loadNCCL() error {
	const what = "NCCL"
	name := l.cfg.NCCL
	h, err := dlopen(name)
	if err != nil {
		return &LoadError{Library: name, What: what, Err: err}
	}
	f := &l.nc
	for _, s := range []struct {
		name string
		dst  *uintptr
	}{
		{"ncclGetVersion", &f.getVersion}, {"ncclGetUniqueId", &f.getUniqueID},
		{"ncclGetErrorString", &f.getErrorString}, {"ncclGetLastError", &f.getLastError},
		{"ncclCommAbort", &f.commAbort}, {"ncclCommDestroy", &f.commDestroy}, {"ncclCommFinalize", &f.commFinalize},
		{"ncclCommGetAsyncError", &f.commGetAsyncError}, {"ncclCommUserRank", &f.commUserRank},
		{"ncclGroupStart", &f.groupStart}, {"ncclGroupEnd", &f.groupEnd},
		{"ncclAllReduce", &f.allReduce}, {"ncclAllGather", &f.allGather}, {"ncclReduceScatter", &f.reduceScatter},
		{"ncclBroadcast", &f.broadcast}, {"ncclReduce", &f.reduce}, {"ncclSend", &f.send}, {"ncclRecv", &f.recv},
	} {
		// ncclGetVersion exists in every release; check the version before
		// complaining about newer functions, so an old NCCL gets the
		// version message rather than a missing-symbol one.
		if s.name == "ncclGetVersion" {
			if err := sym(h, name, what, s.name, s.dst); err != nil {
				return err
			}
			var code int32
			call(f.getVersion, uintptr(unsafe.Pointer(&code)))
			l.Version = versionOf(int(code))
			if l.Version.Less(l.cfg.MinVersion) {
				return &VersionError{Library: name, Have: l.Version, Min: l.cfg.MinVersion}
			}
			continue
		}
		if err := sym(h, name, what, s.name, s.dst); err != nil {
			return err
		}
	}
	var initRank uintptr
	if err := sym(h, name, what, "ncclCommInitRankConfig", &initRank); err != nil {
		return err
	}
	purego.RegisterFunc(&l.initRankConfig, initRank)
	purego.RegisterFunc(&l.errorString, f.getErrorString)
	purego.RegisterFunc(&l.lastError, f.getLastError)
	return nil
}

// call invokes a C function that takes only integer or pointer arguments.
// Its first result is returned; the C functions called here return int
// results (CUresult, ncclResult_t) or pointers. Arguments converted from
// pointers keep their objects alive and unmoved for the call, as with
// syscall.Syscall.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// errName is the driver's name for a CUresult.
func (l *Library) errName(r int) string {
	var p *byte
	if int32(call(l.cu.getErrorName, uintptr(r), uintptr(unsafe.Pointer(&p)))) != cudaSuccess || p == nil {
		return ""
	}
	return goString(p)
}

// check turns a CUresult into an error.
func (l *Library) check(what string, r uintptr) error {
	code := int(int32(r))
	if code == cudaSuccess {
		return nil
	}
	return &CUDAError{Call: what, Code: code, Name: l.errName(code)}
}

// ncclErr turns an ncclResult_t into an error with NCCL's own account.
func (l *Library) ncclErr(what string, r Result, comm uintptr, rank int) error {
	e := &NCCLError{Call: what, Result: r, Rank: rank}
	e.Text = l.errorString(int32(r))
	e.Last = l.lastError(comm)
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// UniqueID makes a new id (ncclGetUniqueId). NCCL starts the bootstrap
// listener in this process, so it must stay alive until every rank has
// initialized.
func (l *Library) UniqueID() (UniqueID, error) {
	var id UniqueID
	if r := Result(call(l.nc.getUniqueID, uintptr(unsafe.Pointer(&id)))); r != Success {
		return id, l.ncclErr("ncclGetUniqueId", r, 0, -1)
	}
	return id, nil
}

// Device is one CUDA device's primary context (the one NCCL and the CUDA
// runtime use). Safe for concurrent use.
type Device struct {
	lib   *Library
	Index int    // ordinal among the devices this process sees
	Name  string // cuDeviceGetName
	ctx   uintptr

	modOnce sync.Once
	modErr  error
	kernels [4]uintptr // count-wrong kernels for 1, 2, 4, 8-byte elements
}

var (
	devMu   sync.Mutex
	devices = map[*Library]map[int]*Device{}
)

// Device returns device i (0 ≤ i < Devices), retaining its primary context
// for the life of the process.
func (l *Library) Device(i int) (*Device, error) {
	devMu.Lock()
	defer devMu.Unlock()
	if d := devices[l][i]; d != nil {
		return d, nil
	}
	if i < 0 || i >= l.Devices {
		return nil, &NoDeviceError{Reason: fmt.Sprintf("device %d asked for, %d visible", i, l.Devices), Visible: os.Getenv("CUDA_VISIBLE_DEVICES")}
	}
	var dev int32
	if err := l.check("cuDeviceGet", call(l.cu.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(i))); err != nil {
		return nil, err
	}
	d := &Device{lib: l, Index: i}
	if err := l.check("cuDevicePrimaryCtxRetain", call(l.cu.primaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(dev))); err != nil {
		return nil, err
	}
	var name [256]byte
	if l.check("cuDeviceGetName", call(l.cu.deviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev))) == nil {
		d.Name = goString(&name[0])
	}
	if devices[l] == nil {
		devices[l] = map[int]*Device{}
	}
	devices[l][i] = d
	return d, nil
}

// bind pins the calling goroutine to its OS thread and makes the device's
// context current there: CUDA keeps the current context per thread, and a
// goroutine may move between threads between two calls. The returned
// function undoes the pinning.
func (d *Device) bind() (func(), error) {
	runtime.LockOSThread()
	if err := d.lib.check("cuCtxSetCurrent", call(d.lib.cu.ctxSetCurrent, d.ctx)); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return runtime.UnlockOSThread, nil
}

// do runs f with the device bound to the calling thread.
func (d *Device) do(f func() error) error {
	unbind, err := d.bind()
	if err != nil {
		return err
	}
	defer unbind()
	return f()
}

// DeviceNames loads only the CUDA driver (cuda, e.g. "libcuda.so.1") and
// returns the names of the devices this process can see, in ordinal order,
// CUDA_VISIBLE_DEVICES applied as for a rank. NCCL is not needed: a host's
// GPUs are counted (gorun doctor, the default --gpus-per-host) even where
// NCCL is missing. Errors are Open's: *LoadError, *NoDeviceError.
func DeviceNames(cuda string) ([]string, error) {
	l := &Library{cfg: LibraryConfig{CUDA: cuda}}
	if err := l.loadCUDA(); err != nil {
		return nil, err
	}
	names := make([]string, l.Devices)
	for i := range names {
		var dev int32
		if err := l.check("cuDeviceGet", call(l.cu.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(i))); err != nil {
			return nil, err
		}
		var name [256]byte
		if err := l.check("cuDeviceGetName", call(l.cu.deviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev))); err != nil {
			return nil, err
		}
		names[i] = goString(&name[0])
	}
	return names, nil
}
