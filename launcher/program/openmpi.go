package program

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gorun-hpc/gorun/internal/elfneeded"
)

// Why gorun refuses Open MPI programs instead of serving them:
//
// Open MPI 4.1 forms its world through PMIx: each rank's MPI_Init dials a
// PMIx server named in PMIX_SERVER_URI* variables and authenticates with
// it, and the ess/schizo components also want their launcher's own
// variables (OMPI_MCA_orte_*). Serving that means a PMIx server built with
// cgo against libpmix (a second binary, since gorun's default binary is
// static), started by every host agent, plus satisfying Open MPI's launch
// detection — a separate body of work that gorun does not do today.
// Without it, an Open MPI rank started by gorun silently becomes a
// one-rank singleton (verified with Debian's Open MPI 4.1: `gorun -np 2`
// printed "rank 0 of 1" twice and exited 0). A silent wrong world is worse
// than an error, so gorun looks at the program's dynamic libraries before
// any rank starts and refuses one linked against Open MPI, saying how to
// run it instead.
//
// What the check sees: the program's DT_NEEDED libraries and theirs in
// turn (resolved through its RPATH/RUNPATH, LD_LIBRARY_PATH and the
// standard directories). What it cannot see: an interpreter that loads MPI
// at run time (python3 with mpi4py built against Open MPI), or a library
// opened with dlopen. Those are stopped in MPI_Init instead, by the MCA
// parameters every rank gets (the launcher's openMPIRefusalVars, pmi.go): each rank exits 1
// with Open MPI's error naming gorun, never as a singleton.

// ErrOpenMPI is wrapped by the error for a program linked against Open MPI.
var ErrOpenMPI = errors.New("linked against Open MPI, which forms its world through a PMIx server that gorun does not run")

// openMPILibs are the sonames that identify Open MPI (libmpi.so.40 is Open
// MPI 3-5's; MPICH's is libmpi.so.12 / libmpich.so.12).
var openMPILibs = []string{"libmpi.so.40", "libopen-rte.so.", "libopen-pal.so.", "libmpi_mpifh.so.40", "libmpi_cxx.so.40"}

// CheckOpenMPI returns an *Error wrapping ErrOpenMPI when the ELF
// program at path links Open MPI, directly or through its libraries. A file
// that is not ELF (a script) or cannot be read passes: the check only
// refuses what it positively recognized.
func CheckOpenMPI(name, path string) error {
	lib, chain := findOpenMPI(path)
	if lib == "" {
		return nil
	}
	via := ""
	if len(chain) > 0 {
		via = " through " + strings.Join(chain, " → ")
	}
	return &Error{Program: name, Err: fmt.Errorf("%w (it needs %s%s); run it with Open MPI's mpirun, "+
		"or rebuild it with MPICH (mpicc.mpich) to run it under gorun", ErrOpenMPI, lib, via)}
}

// findOpenMPI returns the first Open MPI soname among the program's
// libraries and the libraries that led to it.
func findOpenMPI(path string) (string, []string) {
	return elfneeded.Find(path, func(soname string) bool {
		for _, o := range openMPILibs {
			if strings.HasPrefix(soname, o) {
				return true
			}
		}
		return false
	})
}
