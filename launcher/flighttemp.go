package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun-hpc/gorun/internal/owner"
)

// Temporary flight directories are named gorun-flight-<pidns>-<pid>-<random>
// after the process that made them, as shared-memory segments are (package
// internal/owner). A process removes its own at the end, and a host
// agent's supervisor removes the agent's if the agent dies; what neither
// can remove is the directory of a process killed with everything around
// it (a host taken down whole: kill-host injections do that to a host's
// agent, supervisor and ranks at once). So each new one first removes
// those of dead processes: in this PID namespace (a pid means nothing in
// another), owned by this user, whose process no longer exists.

const flightTempPrefix = "gorun-flight-"

// makeFlightTemp sweeps stale flight directories, then makes a new one.
func makeFlightTemp() (string, error) {
	ns := owner.PIDNamespace()
	sweepFlightTemps(os.TempDir(), ns, func(pid int) bool { return owner.Gone(pid, ns) })
	return os.MkdirTemp("", fmt.Sprintf("%s%d-%d-", flightTempPrefix, ns, os.Getpid()))
}

// sweepFlightTemps removes the flight directories in dir made in PID
// namespace ns by processes that are gone, and owned by this user. A
// directory whose name does not parse (another program's, or an older
// gorun's) is left alone.
func sweepFlightTemps(dir string, ns uint64, gone func(pid int) bool) {
	if ns == 0 {
		return
	}
	names, _ := filepath.Glob(filepath.Join(dir, flightTempPrefix+"*"))
	for _, name := range names {
		f := strings.SplitN(strings.TrimPrefix(filepath.Base(name), flightTempPrefix), "-", 3)
		if len(f) != 3 {
			continue
		}
		n, err1 := strconv.ParseUint(f[0], 10, 64)
		pid, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil || n != ns || pid <= 0 || pid == os.Getpid() {
			continue
		}
		fi, err := os.Lstat(name)
		if err != nil || !fi.IsDir() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			continue
		}
		if gone(pid) {
			_ = os.RemoveAll(name)
		}
	}
}
