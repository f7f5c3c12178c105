package chaos

import (
	"strings"
	"time"
)

// ompiHello is an interpreter that loads Open MPI at run time (as Python
// with an mpi4py built for Open MPI does): the library check of gorun's
// program (launcher/program) sees no MPI in python3, so only the environment gorun
// gives Open MPI's start-up can refuse it. Run as a singleton it prints
// "rank 0 of 1" and exits 0.
const ompiHello = `import ctypes, sys
m = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
if m.MPI_Init(None, None) != 0:
    sys.exit("MPI_Init failed")
world = ctypes.addressof(ctypes.c_char.in_dll(m, "ompi_mpi_comm_world"))
r, n = ctypes.c_int(), ctypes.c_int()
m.MPI_Comm_rank(ctypes.c_void_p(world), ctypes.byref(r))
m.MPI_Comm_size(ctypes.c_void_p(world), ctypes.byref(n))
print("rank %d of %d" % (r.value, n.value), flush=True)
m.MPI_Finalize()
`

// programRows are the rows whose fault is in what a rank does to gorun's
// services, or whose program is not the chaos rank.
func programRows() []row {
	return []row{
		// A rank writes junk to its PMI_FD: the PMI server answers that
		// the request was malformed and closes the connection at once,
		// so the rank fails by itself and the job ends, instead of the
		// rank blocking on a server that stopped reading and the others
		// waiting for the formation timeout (2 minutes).
		{mode: "gorun", fault: "pmi-junk", phase: "launch", np: 3, victim: 1, bound: 15 * time.Second, ci: true,
			cause: []string{"rank 1", "exited with code 6"}, names: "the PMI server answered junk",
			extra: func(out string) []string {
				if !strings.Contains(out, "malformed") {
					return []string{"the junk writer never heard the server say its request was malformed"}
				}
				return nil
			}},
		// Open MPI loaded at run time (python3, ctypes): every rank must
		// fail in MPI_Init with an error naming gorun, never run as a
		// silent singleton that exits 0.
		{mode: "gorun", fault: "openmpi", phase: "runtime-load", np: 2, victim: -1, bound: 30 * time.Second, ci: true,
			prog: []string{"python3", "-c", ompiHello}, cause: []string{"exited with code"},
			extra: func(out string) []string {
				if strings.Contains(out, "libmpi.so.40: cannot open") {
					return []string{"Open MPI is not installed (scripts/install-test-deps.sh installs it): the row cannot run"}
				}
				var v []string
				if strings.Contains(out, " of 1") {
					v = append(v, "a rank ran as a singleton")
				}
				if !strings.Contains(out, "gorun_does_not_serve_Open_MPI") {
					v = append(v, "the ranks' error does not name gorun's refusal")
				}
				return v
			}},
		// gorun bench mid-sweep (a billion calls of 8 B), one rank sent
		// SIGTERM with every peer healthy: the collectives of a healthy
		// world complete without looking at the context, so only the
		// sweep's own check per iteration stops it; then its peer loses
		// it and the job ends, long before the billion calls or the 30 s
		// grace.
		{mode: "gorun", fault: "term", phase: "bench", np: 2, victim: 1, bound: 20 * time.Second, ci: true,
			prog: benchSweep, args: []string{"--grace", "30s"},
			inject: []string{"kill:rank=1:at=2s:sig=TERM"}, cause: []string{"rank 1"}},
		// The same sweep with rank 1 frozen: named at its lease.
		{mode: "gorun", fault: "stop", phase: "bench", np: 2, victim: 1, bound: 20 * time.Second,
			prog: benchSweep, args: []string{"--grace", "30s"},
			inject: []string{"stop:rank=1:at=2s"}, cause: []string{"rank 1", "frozen"}},
	}
}

// benchSweep is a gorun bench sweep that would run for hours.
var benchSweep = []string{"GORUN", "bench", "allreduce", "-b", "8", "-e", "8", "-w", "0", "-n", "1000000000"}
