package supervisor

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// The host's hardware topology, discovered once per host and handed to
// the ranks.
//
// Every rank of an MPICH program discovers its host's topology with hwloc
// inside MPI_Init (MPICH uses it for binding sets and intranode trees).
// Discovery reads sysfs and each PCI device's config space; in a virtual
// machine a config-space read traps to the hypervisor and the kernel
// serialises them on one lock, so n ranks starting together queue behind
// each other. Measured on the 2-core reference VM (16 ranks of an
// MPI_Init + MPI_Barrier + MPI_Finalize program, perf): 22 % of all CPU
// time was pci_user_read_config_dword, and the ranks' system time was
// 0.46-0.52 s; with the topology read from XML instead it was 0.08-0.17 s
// (notes/mpi.md). This is the problem PMIx solves for Open MPI by sharing
// the launcher's topology with the ranks.
//
// hwloc has a documented way in: HWLOC_XMLFILE names an XML topology to
// load instead of discovering, and HWLOC_THISSYSTEM=1 says that it
// describes the machine the process runs on (so binding still works). So
// the supervisor — one per host per job — discovers the topology once
// through the same libhwloc.so.15 the ranks load, exports it as XML into a
// sealed memfd, and passes that to each rank as an inherited descriptor
// named by HWLOC_XMLFILE=/proc/self/fd/N. A memfd rather than a file: it
// disappears with the last process holding it, on every exit path, so
// nothing is left behind if the supervisor is killed.
//
// The XML holds every I/O object (filter KEEP_ALL): hwloc applies the
// importing program's own type filters when it loads XML (checked here: a
// program keeping only "important" PCI devices saw 2 of the 6 in a
// KEEP_ALL export, the same 2 it discovers itself), so a superset is what
// every importer can narrow to what it would have found.
//
// It is done only when it is certainly right: the rank's program is ELF
// and needs libhwloc.so.15 (directly or through MPICH), so the library
// that reads the XML is the one that wrote it; the rank's environment does
// not already steer hwloc (HWLOC_XMLFILE, HWLOC_SYNTHETIC, HWLOC_FSROOT,
// HWLOC_CPUID_PATH, HWLOC_COMPONENTS); and GORUN_TOPOLOGY (gorun
// --topology) is not "off". If the descriptor is closed by the time hwloc
// opens it (a rank program that closes inherited descriptors and then
// execs an MPI program), hwloc warns and falls back to its own discovery
// (tried), so the failure mode is the old speed, not a wrong topology.

// topologyEnv in a rank's environment (gorun --topology, or -x) chooses
// "auto" (the default) or "off".
const topologyEnv = rankenv.Topology

// Topology sharing policies (values of GORUN_TOPOLOGY).
const (
	TopologyAuto = "auto"
	TopologyOff  = "off"
)

// hwlocSoname is the libhwloc the shared topology is made with; a rank is
// given it only when its program needs this same soname.
const hwlocSoname = "libhwloc.so.15"

// hwlocSteering are the variables with which a user already tells hwloc
// where its topology comes from; gorun then stays out.
var hwlocSteering = []string{"HWLOC_XMLFILE", "HWLOC_SYNTHETIC", "HWLOC_FSROOT", "HWLOC_CPUID_PATH", "HWLOC_COMPONENTS"}

// ParseTopology checks a --topology value.
func ParseTopology(s string) (string, error) {
	switch s {
	case "", TopologyAuto:
		return TopologyAuto, nil
	case TopologyOff:
		return TopologyOff, nil
	}
	return "", fmt.Errorf("--topology %q: expected auto or off", s)
}

// topologyShare is one host's shared topology. It is made in the
// background from the moment the supervisor reads its spec, so that the
// discovery overlaps the supervisor's other set-up, and the ranks wait for
// it at most topologyWait: a discovery slower than that (a machine under
// heavy load) must not hold back the ranks or the supervisor's lease
// beats, and the ranks then discover the topology themselves.
type topologyShare struct {
	done     chan struct{} // closed by make's goroutine; nil if none was started
	reported bool          // the supervisor logged the outcome

	mu        sync.Mutex
	file      *os.File // sealed memfd with the XML; nil if it could not be made
	err       error
	took      time.Duration
	abandoned bool // close ran first: the goroutine closes file itself
}

// topologyWait bounds how long rank start-up waits for the discovery.
// Measured on the 2-core reference VM: 20-100 ms quiet, up to 240 ms on a
// cold page cache.
const topologyWait = time.Second

// start begins making the topology if any of the ranks wants it. The
// goroutine's owner is t: close waits for nothing, and a goroutine that
// finishes after close releases what it made.
func (t *topologyShare) start(progs programs, ranks []wire.SupervisorRank) {
	want := false
	for _, r := range ranks {
		if t.wants(progs.of(r.Path), r.Env) {
			want = true
			break
		}
	}
	if !want {
		return
	}
	t.done = make(chan struct{})
	go func() {
		defer close(t.done)
		t0 := time.Now()
		f, err := makeTopologyFile()
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.abandoned {
			if f != nil {
				f.Close()
			}
			return
		}
		t.file, t.err, t.took = f, err, time.Since(t0)
	}()
}

// wants reports whether the rank with this program and environment should
// be given the shared topology.
func (t *topologyShare) wants(prog *program, env []string) bool {
	if envValue(env, topologyEnv, TopologyAuto) == TopologyOff {
		return false
	}
	for _, name := range hwlocSteering {
		if envValue(env, name, "") != "" {
			return false
		}
	}
	return prog.needsHwloc()
}

// get returns the memfd with the XML once it is made, waiting at most
// until deadline; nil and why when there is none.
func (t *topologyShare) get(deadline time.Time) (*os.File, time.Duration, error) {
	if t.done == nil {
		return nil, 0, errors.New("no rank needs it")
	}
	select {
	case <-t.done:
	case <-time.After(time.Until(deadline)):
		return nil, 0, fmt.Errorf("discovery took longer than %v", topologyWait)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.file, t.took, t.err
}

// close drops the supervisor's copy of the descriptor (the ranks hold
// their own) or leaves it to a discovery still running.
func (t *topologyShare) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.abandoned = true
	if t.file != nil {
		t.file.Close()
		t.file = nil
	}
}

// topologyForRank adds the shared topology to one rank's inherited files and
// environment: the memfd becomes descriptor len(files) in the rank.
func topologyForRank(f *os.File, files []*os.File, env []string) ([]*os.File, []string) {
	fd := len(files)
	return append(files, f), append(env,
		rankenv.HwlocXMLFile+"=/proc/self/fd/"+strconv.Itoa(fd),
		rankenv.HwlocThisSystem+"=1")
}

// makeTopologyFile discovers the topology and seals its XML in a memfd.
func makeTopologyFile() (*os.File, error) {
	xml, err := exportTopologyXML()
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("gorun-hwloc-topology", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd for the topology: %w", err)
	}
	f := os.NewFile(uintptr(fd), "hwloc-topology")
	if _, err := f.Write(xml); err != nil {
		f.Close()
		return nil, fmt.Errorf("write the topology: %w", err)
	}
	// Sealed: one rank cannot change what the others read.
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal the topology: %w", err)
	}
	return f, nil
}

// envValue is the last value of name in env (exec's rule), or def.
func envValue(env []string, name, def string) string {
	v := def
	for _, kv := range env {
		if rest, ok := strings.CutPrefix(kv, name+"="); ok {
			v = rest
		}
	}
	return v
}
