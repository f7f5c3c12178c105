package flight

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// BeforeStop bounds how long a failed job waits, before its teardown
// signal, for the ranks it asked with SIGUSR2 to write their flight
// records (gorun for a local job, each host agent for its own ranks in a
// multi-host one): a rank that gorun's SIGTERM reaches before its own
// communicator has failed (a desync or a lost peer noticed a moment later)
// would otherwise leave nothing for the merged table, which then cannot
// show where the ranks disagree. Dumping takes milliseconds; the wait ends
// as soon as every signalled rank has written.
const BeforeStop = 500 * time.Millisecond

// Dir is one host's flight directory. A nil *Dir is no directory: its
// methods then do nothing and report none, so a job that could not make
// one runs with its records in the ranks' logs only. Not safe for
// concurrent use except SignalReady and DumpedSince, which only read.
type Dir struct {
	path string
	// temp: made by MakeTemp, so Remove removes it.
	temp bool
}

// At is the flight directory at path, which the caller made and keeps
// (--output-dir's flight/): Remove leaves it.
func At(path string) *Dir { return &Dir{path: path} }

// Path is the directory; "" for a nil Dir.
func (d *Dir) Path() string {
	if d == nil {
		return ""
	}
	return d.path
}

// Temp is the directory when MakeTemp made it (its maker removes it, and
// a supervisor told of it removes it should its maker die); "" otherwise.
func (d *Dir) Temp() string {
	if d == nil || !d.temp {
		return ""
	}
	return d.path
}

// Env is the variable naming the directory for the ranks; "" without one.
func (d *Dir) Env() string {
	if d == nil {
		return ""
	}
	return comm.FlightDirEnv + "=" + d.path
}

// Read returns the dumps in the directory (comm.ReadFlightDumps).
func (d *Dir) Read() ([]comm.FlightDump, error) {
	if d == nil {
		return nil, nil
	}
	return comm.ReadFlightDumps(d.path)
}

// Remove removes the directory if MakeTemp made it.
func (d *Dir) Remove() {
	if t := d.Temp(); t != "" {
		_ = os.RemoveAll(t)
	}
}

// SignalReady sends SIGUSR2 to the processes that said, with a ready.<pid>
// file, that they dump flight records on it (comm installs the handler),
// and returns how many it signalled. A pid whose environment does not name
// this directory (a rank that died, its pid reused) is skipped: SIGUSR2
// kills a process without a handler.
func (d *Dir) SignalReady() int {
	if d == nil {
		return 0
	}
	names, _ := filepath.Glob(filepath.Join(d.path, "ready.*"))
	want := []byte(d.Env() + "\x00")
	n := 0
	for _, name := range names {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(name), "ready."))
		if err != nil || pid <= 0 {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGUSR2) == nil {
			n++
		}
	}
	return n
}

// DumpedSince counts the processes that finished a flight dump at or after
// since: comm writes dumped.<pid> after each dump it makes on SIGUSR2, one
// marker per process as SignalReady counts them.
func (d *Dir) DumpedSince(since time.Time) int {
	if d == nil {
		return 0
	}
	names, _ := filepath.Glob(filepath.Join(d.path, "dumped.*"))
	n := 0
	for _, name := range names {
		if st, err := os.Stat(name); err == nil && !st.ModTime().Before(since) {
			n++
		}
	}
	return n
}

// DumpBeforeStop has the ranks that dump on SIGUSR2 write their flight
// records and waits until each has, or BeforeStop passed. It blocks the
// caller; a host agent calls it before relaying a failed job's teardown
// signal (wire.Cmd.DumpFirst).
func (d *Dir) DumpBeforeStop() {
	asked := time.Now()
	n := d.SignalReady()
	for until := asked.Add(BeforeStop); n > 0 && d.DumpedSince(asked) < n && time.Now().Before(until); {
		time.Sleep(5 * time.Millisecond)
	}
}
