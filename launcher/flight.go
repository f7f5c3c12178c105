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
	"github.com/gorun-hpc/gorun/launcher/output"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Flight records: every rank's communicators write their recent calls to
// the job's flight directory (comm.FlightDirEnv) when they fail and on
// SIGUSR2, which gorun forwards to the ranks like any other signal; gorun
// then merges what the ranks wrote into one table that marks the first
// sequence number where the ranks disagree. The directory is
// <output-dir>/flight with --output-dir, else a temporary directory
// removed at the end of the job (flighttemp.go).
//
// Multi-host jobs: every host agent makes a temporary flight directory
// for its own ranks (removed by the agent at the end, or by its supervisor
// if the agent dies), and sends what its ranks wrote to gorun as "flight"
// events: on a "flight" command (after SIGUSR2 or at --timeout, when gorun
// has given the ranks time to dump), and on its own once its ranks are
// gone, before "done". gorun keeps what arrived, writes it to its own
// flight directory, and merges it into the same table. The hosts' clocks
// never meet: an agent picks the dumps written since it relayed the
// request, on its own clock, and gorun keeps whatever agents sent since it
// asked.

// flightWait is how long gorun waits for the ranks' dumps after forwarding
// SIGUSR2 before printing what arrived.
const flightWait = time.Second

// flightBeforeStop bounds how long a failed job waits, before its teardown
// signal, for the ranks it asked with SIGUSR2 to write their flight records
// (gorun for a local job, each host agent for its own ranks in a multi-host
// one): a rank that gorun's SIGTERM reaches before its own communicator
// has failed (a desync or a lost peer noticed a moment later) would
// otherwise leave nothing for the merged table, which then cannot show
// where the ranks disagree. Dumping takes milliseconds; the wait ends as
// soon as every signalled rank has written.
const flightBeforeStop = 500 * time.Millisecond

// dumpedSince counts the processes that finished a flight dump at or after
// since: comm writes dumped.<pid> in dir after each dump it makes on
// SIGUSR2 (comm/flight_unix.go), one marker per process as signalReady
// counts them.
func (f *flightRecords) dumpedSince(since time.Time) int {
	if f == nil || f.dir == "" {
		return 0
	}
	names, _ := filepath.Glob(filepath.Join(f.dir, "dumped.*"))
	n := 0
	for _, name := range names {
		if st, err := os.Stat(name); err == nil && !st.ModTime().Before(since) {
			n++
		}
	}
	return n
}

// flightRecords is a local job's flight directory. Owned by RunLocal and,
// while it runs, the job loop.
type flightRecords struct {
	// dir holds the ranks' flight records; "" when none could be made.
	dir string
	// temp is dir when RunLocal made it (and removes it).
	temp   string
	log    zerolog.Logger
	stderr *output.Sink
	// printed: the job loop printed the table at --timeout, so RunLocal
	// does not print it again.
	printed bool

	// remote: the dumps come from host agents ("flight" events), not
	// from ranks writing into dir. got holds every dump received, by
	// group and world rank (the latest wins, as a file would be
	// replaced), and asked the keys received since the last ask.
	remote bool
	got    map[string]comm.FlightDump
	asked  map[string]bool
}

// store keeps dumps a host agent sent (and writes them to dir for
// --output-dir). Job loop only.
func (f *flightRecords) store(d comm.FlightDump) {
	if f == nil {
		return
	}
	if f.got == nil {
		f.got, f.asked = map[string]comm.FlightDump{}, map[string]bool{}
	}
	key := fmt.Sprintf("%s/%d", d.Group, d.WorldRank)
	f.got[key], f.asked[key] = d, true
	if f.dir != "" {
		if err := comm.WriteFlightDump(f.dir, d); err != nil {
			f.log.Warn().Err(err).Msg("writing a host's flight records")
		}
	}
}

// ask starts a new request for dumps: print(since) then shows only what
// arrives after it (remote jobs). Job loop only.
func (f *flightRecords) ask() {
	if f != nil {
		f.asked = map[string]bool{}
	}
}

// active reports whether the ranks write flight records gorun can merge.
func (f *flightRecords) active() bool { return f != nil && (f.remote || f.dir != "") }

// prepareFlight makes the job's flight directory. Its env is the variable
// that names it for the ranks ("" when it cannot be made: records then go
// to the ranks' logs only).
func prepareFlight(cfg Config, stderr *output.Sink) *flightRecords {
	f := &flightRecords{log: cfg.Logger, stderr: stderr}
	dir := ""
	var err error
	if cfg.OutputDir != "" {
		dir = filepath.Join(cfg.OutputDir, "flight")
		err = output.OwnSubdir(dir)
	} else {
		dir, err = makeFlightTemp()
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

// print merges the dumps and prints the table to gorun's stderr: for a
// local job those in the flight directory written since `since`; for a
// multi-host job those its host agents sent since the last ask (every one
// when since is zero). It reports whether there was any.
func (f *flightRecords) print(why string, since time.Time) bool {
	if f == nil {
		return false
	}
	var fresh []comm.FlightDump
	where := f.dir
	if f.remote {
		for k, d := range f.got {
			if since.IsZero() || f.asked[k] {
				fresh = append(fresh, d)
			}
		}
		where = "the hosts"
	} else {
		if f.dir == "" {
			return false
		}
		dumps, err := comm.ReadFlightDumps(f.dir)
		if err != nil {
			f.log.Warn().Err(err).Msg("reading flight records")
		}
		for _, d := range dumps {
			if !d.Time.Before(since) {
				fresh = append(fresh, d)
			}
		}
	}
	if len(fresh) == 0 {
		return false
	}
	f.stderr.WriteLines(fmt.Appendf(nil, "gorun: flight records (%s), merged from %d dumps from %s:\n%s", why, len(fresh), where, comm.FlightTable(fresh)))
	return true
}

// sendFlight is a host agent's side: it sends gorun, as "flight" events
// under rank (one of this host's), every dump in the agent's flight
// directory written at or after since, then, when end is set, an event
// that says the answer is complete.
func sendFlight(f *flightRecords, w *wire.Conn, rank int, since time.Time, end bool) {
	if f != nil && f.dir != "" {
		dumps, err := comm.ReadFlightDumps(f.dir)
		if err != nil {
			f.log.Warn().Err(err).Msg("reading the ranks' flight records")
		}
		for i := range dumps {
			if !dumps[i].Time.Before(since) {
				_ = w.Send(wire.Msg{T: "event", Event: &wire.Event{Ev: "flight", Rank: rank, Flight: &dumps[i]}})
			}
		}
	}
	if end {
		_ = w.Send(wire.Msg{T: "event", Event: &wire.Event{Ev: "flight", Rank: rank, FlightEnd: true}})
	}
}

// agentFlight makes a host agent's temporary flight directory (nil when
// it cannot: the ranks' records then go to their logs only).
func agentFlight(log zerolog.Logger) *flightRecords {
	dir, err := makeFlightTemp()
	if err != nil {
		log.Warn().Err(err).Msg("no flight-record directory; records go to the ranks' logs only")
		return nil
	}
	return &flightRecords{dir: dir, temp: dir, log: log}
}

// remove removes the temporary flight directory.
func (f *flightRecords) remove() {
	if f != nil && f.temp != "" {
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

// dumpBeforeStop has the ranks that dump on SIGUSR2 write their flight
// records and waits until each has, or flightBeforeStop passed: a host
// agent's part of a failed job's teardown (wire.Cmd.DumpFirst).
func (f *flightRecords) dumpBeforeStop() {
	asked := time.Now()
	n := f.signalReady()
	for until := asked.Add(flightBeforeStop); n > 0 && f.dumpedSince(asked) < n && time.Now().Before(until); {
		time.Sleep(5 * time.Millisecond)
	}
}

// isRemote reports whether the dumps come from host agents.
func (f *flightRecords) isRemote() bool { return f != nil && f.remote }
