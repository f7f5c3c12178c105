package launcher

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/launcher/flight"
	"github.com/gorun-hpc/gorun/launcher/output"
)

// Flight records, gorun's side: every rank's communicators write their
// recent calls to the job's flight directory (package launcher/flight) when
// they fail and on SIGUSR2, which gorun forwards to the ranks like any other
// signal; gorun then merges what the ranks wrote into one table that marks
// the first sequence number where the ranks disagree. The directory is
// <output-dir>/flight with --output-dir, else a temporary directory
// removed at the end of the job.
//
// Multi-host jobs: every host agent makes a temporary flight directory
// for its own ranks (removed by the agent at the end, or by its supervisor
// if the agent dies), and sends what its ranks wrote to gorun as "flight"
// events (launcher/hostagent): on a "flight" command (after SIGUSR2 or at
// --timeout, when gorun has given the ranks time to dump), and on its own
// once its ranks are gone, before "done". gorun keeps what arrived, writes
// it to its own flight directory, and merges it into the same table. The
// hosts' clocks never meet: an agent picks the dumps written since it
// relayed the request, on its own clock, and gorun keeps whatever agents
// sent since it asked.

// flightWait is how long gorun waits for the ranks' dumps after forwarding
// SIGUSR2 before printing what arrived.
const flightWait = time.Second

// flightRecords is a local job's flight directory. Owned by RunLocal and,
// while it runs, the job loop.
type flightRecords struct {
	// dir holds the ranks' flight records; nil when none could be made.
	dir    *flight.Dir
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
	if f.dir != nil {
		if err := comm.WriteFlightDump(f.dir.Path(), d); err != nil {
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
func (f *flightRecords) active() bool { return f != nil && (f.remote || f.dir != nil) }

// prepareFlight makes the job's flight directory. Its env is the variable
// that names it for the ranks ("" when it cannot be made: records then go
// to the ranks' logs only).
func prepareFlight(cfg Config, stderr *output.Sink) *flightRecords {
	f := &flightRecords{log: cfg.Logger, stderr: stderr}
	var dir *flight.Dir
	var err error
	if cfg.OutputDir != "" {
		path := filepath.Join(cfg.OutputDir, "flight")
		if err = output.OwnSubdir(path); err == nil {
			dir = flight.At(path)
		}
	} else {
		dir, err = flight.MakeTemp()
	}
	if err != nil {
		f.log.Warn().Err(err).Msg("no flight-record directory; records go to the ranks' logs only")
		return f
	}
	f.dir = dir
	return f
}

// flightDir is the job's flight directory on this machine; nil without one.
func (f *flightRecords) flightDir() *flight.Dir {
	if f == nil {
		return nil
	}
	return f.dir
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
	where := f.dir.Path()
	if f.remote {
		for k, d := range f.got {
			if since.IsZero() || f.asked[k] {
				fresh = append(fresh, d)
			}
		}
		where = "the hosts"
	} else {
		if f.dir == nil {
			return false
		}
		dumps, err := f.dir.Read()
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

// markPrinted notes that the job loop printed the table (at --timeout), so
// that the job's end does not print it again.
func (f *flightRecords) markPrinted() { f.printed = true }

// noneWritten says that no rank wrote flight records after a SIGUSR2.
func (f *flightRecords) noneWritten() {
	f.stderr.WriteLines([]byte("gorun: SIGUSR2: no rank wrote flight records (no communicator open?)\n"))
}

// isRemote reports whether the dumps come from host agents.
func (f *flightRecords) isRemote() bool { return f != nil && f.remote }
