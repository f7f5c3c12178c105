package launcher

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
)

// Flight records: every rank's communicators write their recent calls to
// the job's flight directory (comm.FlightDirEnv) when they fail and on
// SIGUSR2, which gorun forwards to the ranks like any other signal; gorun
// then merges what the ranks wrote into one table that marks the first
// sequence number where the ranks disagree. The directory is
// <output-dir>/flight with --output-dir, else a temporary directory
// removed at the end of the job. Single-host runs only: on other hosts the
// records go to the ranks' logs.

// flightWait is how long gorun waits for the ranks' dumps after forwarding
// SIGUSR2 before printing what arrived.
const flightWait = time.Second

// flightRecords is a local job's flight directory. Owned by RunLocal and,
// while it runs, the job loop.
type flightRecords struct {
	// dir holds the ranks' flight records; "" when none could be made.
	dir string
	// temp is dir when RunLocal made it (and removes it).
	temp   string
	log    zerolog.Logger
	stderr *lineSink
	// printed: the job loop printed the table at --timeout, so RunLocal
	// does not print it again.
	printed bool
}

// prepareFlight makes the job's flight directory. Its env is the variable
// that names it for the ranks ("" when it cannot be made: records then go
// to the ranks' logs only).
func prepareFlight(cfg Config, stderr *lineSink) *flightRecords {
	f := &flightRecords{log: cfg.Logger, stderr: stderr}
	dir := ""
	var err error
	if cfg.OutputDir != "" {
		dir = filepath.Join(cfg.OutputDir, "flight")
		err = os.MkdirAll(dir, 0o755)
	} else {
		dir, err = os.MkdirTemp("", "gorun-flight-")
		f.temp = dir
	}
	if err != nil {
		f.log.Warn().Err(err).Msg("no flight-record directory; records go to the ranks' logs only")
		return f
	}
	f.dir = dir
	return f
}

// env is the variable naming the directory for the ranks; "" without one.
func (f *flightRecords) env() string {
	if f == nil || f.dir == "" {
		return ""
	}
	return comm.FlightDirEnv + "=" + f.dir
}

// printFlight merges the dumps in the flight directory written since `since`
// and prints the table to gorun's stderr. It reports whether there was any.
func (f *flightRecords) print(why string, since time.Time) bool {
	if f == nil || f.dir == "" {
		return false
	}
	dumps, err := comm.ReadFlightDumps(f.dir)
	if err != nil {
		f.log.Warn().Err(err).Msg("reading flight records")
	}
	fresh := dumps[:0]
	for _, d := range dumps {
		if !d.Time.Before(since) {
			fresh = append(fresh, d)
		}
	}
	if len(fresh) == 0 {
		return false
	}
	f.stderr.write(fmt.Appendf(nil, "gorun: flight records (%s), merged from %d dumps in %s:\n%s", why, len(fresh), f.dir, comm.FlightTable(fresh)))
	return true
}

// removeFlight removes the temporary flight directory.
func (f *flightRecords) remove() {
	if f.temp != "" {
		_ = os.RemoveAll(f.temp)
	}
}

// signalReady sends SIGUSR2 to the processes that said, with a
// ready.<pid> file, that they dump flight records on it (comm installs the
// handler), and returns how many it signalled. A pid whose environment does
// not name this job's flight directory (a rank that died, its pid reused)
// is skipped: SIGUSR2 kills a process without a handler.
func (f *flightRecords) signalReady() int {
	if f == nil || f.dir == "" {
		return 0
	}
	names, _ := filepath.Glob(filepath.Join(f.dir, "ready.*"))
	want := []byte(f.env() + "\x00")
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
