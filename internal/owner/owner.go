// Package owner judges names that record the process that made them (a
// shared-memory segment, a temporary flight directory): its pid and its
// PID namespace, so that whatever a killed process could not remove is
// removed by the next one that finds its maker gone.
package owner

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// PIDNamespace is the inode of this process's PID namespace (0 if it
// cannot be read). A name records its maker's, because /dev/shm and /tmp
// may be shared by processes in different PID namespaces (containers run
// with the host's IPC namespace, as NCCL's container guides ask; a test
// under unshare): a pid from another namespace names some other process
// here, or none, and a sweep that judged it would remove another job's
// live files.
var PIDNamespace = sync.OnceValue(func() uint64 {
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) != nil {
		return 0
	}
	return st.Ino
})

// Gone reports whether the maker of a name, process pid of PID namespace
// ns, is known to be gone: ns is this process's namespace and no process
// has that pid. A pid of another namespace is never judged.
func Gone(pid int, ns uint64) bool {
	return ns == PIDNamespace() && errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}
