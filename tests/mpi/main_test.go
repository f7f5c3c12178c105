package mpi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

func TestMain(m *testing.M) {
	os.Exit(setup(m))
}

// setup builds gorun and the MPI test program (MPICH, and Open MPI for the
// refusal) once for the package.
func setup(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gorun-mpi-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if _, err := exec.LookPath("mpicc.mpich"); err != nil {
		missing = "mpicc.mpich (Debian mpich, libmpich-dev)"
	} else {
		gorunBin = filepath.Join(dir, "gorun")
		if err := launchertest.GoBuild(dir, "cmd/gorun"); err != nil {
			setupErr = err
		} else if mpichProg, err = build("mpicc.mpich", dir, "mpiprog-mpich"); err != nil {
			setupErr = err
		}
		if setupErr == nil {
			// An MPICH program that also reads the topology through
			// hwloc itself (libhwloc-dev comes with libmpich-dev).
			hwlocProg = filepath.Join(dir, "hwlocprog")
			if out, err := exec.Command("mpicc.mpich", "-O1", "-Wall", "-o", hwlocProg, "testdata/hwlocprog.c", "-lhwloc").CombinedOutput(); err != nil {
				setupErr = fmt.Errorf("mpicc.mpich hwlocprog.c -lhwloc: %v\n%s", err, out)
			}
		}
		if setupErr == nil {
			// Slurm's PMI-2 client (Debian libpmi2-0-dev), what
			// `srun --mpi=pmi2` programs link.
			out, err := exec.Command("gcc", "-O1", "-Wall", "-o", filepath.Join(dir, "pmi2prog"), "testdata/pmi2prog.c", "-lpmi2").CombinedOutput()
			if err != nil {
				pmi2Err = fmt.Errorf("building the PMI-2 client (needs Debian libpmi2-0-dev): %v\n%s", err, out)
			} else {
				pmi2Prog = filepath.Join(dir, "pmi2prog")
			}
		}
		if _, err := exec.LookPath("mpicc.openmpi"); err == nil && setupErr == nil {
			if ompiProg, err = build("mpicc.openmpi", dir, "mpiprog-ompi"); err != nil {
				setupErr = err
			}
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// requireMPI skips without MPICH when not root (scripts/install-test-deps.sh
// installs it as root, so there a missing MPICH is a failure).
func requireMPI(t *testing.T) {
	t.Helper()
	switch {
	case missing != "" && os.Geteuid() != 0:
		t.Skipf("skipping: %s is not installed (scripts/install-test-deps.sh installs it as root)", missing)
	case missing != "":
		t.Fatalf("%s is not installed; scripts/install-test-deps.sh should have installed it", missing)
	case setupErr != nil:
		t.Fatal(setupErr)
	}
}
