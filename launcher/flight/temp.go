package flight

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun-hpc/gorun/internal/owner"
)

const tempPrefix = "gorun-flight-"

// MakeTemp sweeps the stale flight directories of dead processes (see the
// package comment), then makes a new temporary one named after this
// process.
func MakeTemp() (*Dir, error) {
	ns := owner.PIDNamespace()
	sweep(os.TempDir(), ns, func(pid int) bool { return owner.Gone(pid, ns) })
	path, err := os.MkdirTemp("", fmt.Sprintf("%s%d-%d-", tempPrefix, ns, os.Getpid()))
	if err != nil {
		return nil, err
	}
	return &Dir{path: path, temp: true}, nil
}

// sweep removes the flight directories in dir made in PID namespace ns by
// processes that are gone, and owned by this user. A directory whose name
// does not parse (another program's, or an older gorun's) is left alone.
func sweep(dir string, ns uint64, gone func(pid int) bool) {
	if ns == 0 {
		return
	}
	names, _ := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
	for _, name := range names {
		f := strings.SplitN(strings.TrimPrefix(filepath.Base(name), tempPrefix), "-", 3)
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
