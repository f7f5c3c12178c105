//go:build linux && !nogpu

package supervisor

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// hwloc 2.x's enum hwloc_type_filter_e: KEEP_ALL keeps every object of a
// type (hwloc.h).
const hwlocFilterKeepAll = 0

// exportTopologyXML discovers this host's topology with libhwloc.so.15,
// loaded at run time with purego (no cgo, as for NCCL: the default gorun
// needs neither hwloc's headers nor the library to build or to start), and
// returns it as hwloc XML.
func exportTopologyXML() ([]byte, error) {
	// dlopen/dlerror and hwloc's x86 discovery (which binds the calling
	// thread to each CPU in turn and restores it) must stay on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lib, err := purego.Dlopen(hwlocSoname, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", hwlocSoname, err)
	}
	// The library stays loaded: hwloc may keep state for the process, and
	// the supervisor makes one topology per job.
	var (
		apiVersion     func() uint32
		topoInit       func(*uintptr) int32
		setIOFilter    func(uintptr, int32) int32
		topoLoad       func(uintptr) int32
		exportXMLBuf   func(uintptr, **byte, *int32, uint64) int32
		freeXMLBuf     func(uintptr, *byte)
		topoDestroyFun func(uintptr)
	)
	for _, f := range []struct {
		name string
		fn   any
	}{
		{"hwloc_get_api_version", &apiVersion},
		{"hwloc_topology_init", &topoInit},
		{"hwloc_topology_set_io_types_filter", &setIOFilter},
		{"hwloc_topology_load", &topoLoad},
		{"hwloc_topology_export_xmlbuffer", &exportXMLBuf},
		{"hwloc_free_xmlbuffer", &freeXMLBuf},
		{"hwloc_topology_destroy", &topoDestroyFun},
	} {
		sym, err := purego.Dlsym(lib, f.name)
		if err != nil {
			return nil, fmt.Errorf("%s: no %s: %w", hwlocSoname, f.name, err)
		}
		purego.RegisterFunc(f.fn, sym)
	}
	// The soname fixes the ABI (2.x); the XML format the ranks import is
	// the one this same library writes.
	if v := apiVersion(); v>>16 != 2 {
		return nil, fmt.Errorf("%s reports API version %#x, expected 2.x", hwlocSoname, v)
	}
	var topo uintptr
	if rc := topoInit(&topo); rc != 0 || topo == 0 {
		return nil, fmt.Errorf("hwloc_topology_init failed (%d)", rc)
	}
	defer topoDestroyFun(topo)
	if rc := setIOFilter(topo, hwlocFilterKeepAll); rc != 0 {
		return nil, fmt.Errorf("hwloc_topology_set_io_types_filter failed (%d)", rc)
	}
	if rc := topoLoad(topo); rc != 0 {
		return nil, fmt.Errorf("hwloc_topology_load failed (%d)", rc)
	}
	var buf *byte
	var n int32
	if rc := exportXMLBuf(topo, &buf, &n, 0); rc != 0 || buf == nil || n <= 0 {
		return nil, fmt.Errorf("hwloc_topology_export_xmlbuffer failed (%d)", rc)
	}
	defer freeXMLBuf(topo, buf)
	// buflen counts the terminating NUL; the copy leaves it out.
	xml := make([]byte, n-1)
	copy(xml, unsafe.Slice(buf, n-1)) // C memory, owned by hwloc until freeXMLBuf
	return xml, nil
}
