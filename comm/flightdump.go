package comm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// FlightDirEnv names the directory where communicators write flight records
// when Config.FlightDir is empty. gorun sets it for every rank, and with it
// set, a process dumps its communicators' records on SIGUSR2 (see
// DumpFlightRecords) and leaves a ready.<pid> file there saying so.
const FlightDirEnv = "GORUN_FLIGHT_DIR"

// FlightDump is one communicator's flight recorder as a rank writes it.
type FlightDump struct {
	Group     string         `json:"group"` // the group id, hex
	Rank      int            `json:"rank"`  // group rank
	WorldRank int            `json:"world_rank"`
	Host      string         `json:"host"`
	Size      int            `json:"size"`
	PID       int            `json:"pid"`
	Reason    string         `json:"reason"`
	Time      time.Time      `json:"time"`
	Records   []FlightRecord `json:"records"` // oldest first
}

// flightLogRecords is how many of the latest records a dump puts in the log
// (the file gets all).
const flightLogRecords = 16

// dumpFlight writes the flight recorder to <dir>/flight-<group>-<world
// rank>.json when a flight directory is set (replacing an earlier dump of
// the same communicator), and its latest records to the log. Under gorun
// the directory is set and gorun prints one table merged from every rank's
// file, so a written dump goes to the log at debug level only: a warning
// per rank would repeat that table once per survivor. Without a directory,
// or when writing fails, the log is the only copy and gets a warning.
// Safe for concurrent use.
func (c *Comm) dumpFlight(reason string) {
	d := FlightDump{Group: fmt.Sprintf("%016x", uint64(c.gid)), Rank: c.me, WorldRank: c.g.GlobalRank(c.me),
		Host: c.g.Host(c.me), Size: c.n, PID: os.Getpid(), Reason: reason, Time: time.Now(), Records: c.FlightRecords()}
	written := false
	if c.flightDir != "" {
		if err := WriteFlightDump(c.flightDir, d); err != nil {
			c.log.Warn().Err(err).Msg("comm: writing flight records")
		} else {
			written = true
		}
	}
	ev := c.log.Warn()
	if written {
		ev = c.log.Debug().Str("file", flightDumpName(c.flightDir, d))
	}
	if !ev.Enabled() {
		return
	}
	recs := d.Records[max(0, len(d.Records)-flightLogRecords):]
	var b strings.Builder
	for _, r := range recs {
		b.WriteString("\n  " + r.line())
	}
	ev.Str("reason", reason).Int("records", len(d.Records)).Msg("comm: flight recorder (latest last):" + b.String())
}

// WriteFlightDump writes d to <dir>/flight-<group>-<world rank>.json,
// replacing an earlier dump of the same communicator and rank (a rank
// writes its own; gorun writes those its host agents send).
func WriteFlightDump(dir string, d FlightDump) error {
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return err
	}
	name := flightDumpName(dir, d)
	// A temporary file of its own for each call: one process can dump the
	// same communicator twice at once (its failure and gorun's SIGUSR2), and
	// with one name per process the second rename found the file the first
	// had already renamed away ("no such file or directory").
	f, err := os.CreateTemp(dir, filepath.Base(name)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// flightDumpName is the file WriteFlightDump writes d to.
func flightDumpName(dir string, d FlightDump) string {
	return filepath.Join(dir, fmt.Sprintf("flight-%s-%d.json", d.Group, d.WorldRank))
}

// line renders a record for logs: "#41 AllReduce(float32 sum, count=16) running 2.1s",
// with the caller's label first when it has one ("all_reduce: #41 AllReduce(...) ...").
func (r FlightRecord) line() string {
	s := r.Call.String()
	if r.Label != "" {
		s = r.Label + ": " + s
	}
	if r.P2P {
		s += " (after #" + fmt.Sprint(r.Call.Seq) + ")"
	}
	switch r.State {
	case StateRunning:
		s += fmt.Sprintf(" running since %s", r.Started.Format("15:04:05.000"))
	default:
		s += fmt.Sprintf(" %s in %v", r.State, r.Ended.Sub(r.Started).Round(time.Microsecond))
	}
	if r.Err != "" {
		s += ": " + r.Err
	}
	return s
}

// live is every open communicator of this process, for DumpFlightRecords,
// and the SIGUSR2 handler that serves them while any is open.
var live struct {
	mu      sync.Mutex
	comms   map[*Comm]struct{}
	stopSig func()
}

func register(c *Comm) {
	live.mu.Lock()
	defer live.mu.Unlock()
	if live.comms == nil {
		live.comms = map[*Comm]struct{}{}
	}
	live.comms[c] = struct{}{}
	if len(live.comms) == 1 && live.stopSig == nil {
		if dir := os.Getenv(FlightDirEnv); dir != "" {
			live.stopSig = dumpOnSignal(dir)
		}
	}
}

func unregister(c *Comm) {
	live.mu.Lock()
	delete(live.comms, c)
	var stop func()
	if len(live.comms) == 0 {
		stop, live.stopSig = live.stopSig, nil
	}
	live.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// DumpFlightRecords writes the flight recorder of every open communicator of
// this process (to its log and flight directory) and returns how many it
// wrote. Safe for concurrent use.
func DumpFlightRecords(reason string) int {
	live.mu.Lock()
	cs := make([]*Comm, 0, len(live.comms))
	for c := range live.comms {
		cs = append(cs, c)
	}
	live.mu.Unlock()
	for _, c := range cs {
		c.dumpFlight(reason)
	}
	return len(cs)
}

// ReadFlightDumps reads every flight-*.json in dir.
func ReadFlightDumps(dir string) ([]FlightDump, error) {
	names, err := filepath.Glob(filepath.Join(dir, "flight-*.json"))
	if err != nil {
		return nil, err
	}
	var out []FlightDump
	var errs []error
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var d FlightDump
		if err := json.Unmarshal(b, &d); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
			continue
		}
		out = append(out, d)
	}
	return out, errors.Join(errs...)
}

// FlightTable merges the dumps of each group into one table: a row per
// collective sequence number, a column per rank, each cell the call and
// how it ended, and the first sequence number where the ranks disagree (a
// different call, or a rank that never reached it while others did) marked
// ">>" and named under the table. Rows start a few before the first
// disagreement (or show the latest ones when there is none).
func FlightTable(dumps []FlightDump) string {
	byGroup := map[string][]FlightDump{}
	for _, d := range dumps {
		byGroup[d.Group] = append(byGroup[d.Group], d)
	}
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	var b strings.Builder
	for _, g := range groups {
		ds := byGroup[g]
		slices.SortFunc(ds, func(a, b FlightDump) int { return a.Rank - b.Rank })
		writeGroupTable(&b, g, ds)
	}
	return b.String()
}

func writeGroupTable(b *strings.Builder, group string, ds []FlightDump) {
	type cell struct {
		rec FlightRecord
		ok  bool
	}
	rows := map[uint64][]cell{}
	lo := make([]uint64, len(ds)) // oldest recorded collective per rank
	hi := make([]uint64, len(ds)) // newest
	for i, d := range ds {
		for _, r := range d.Records {
			if r.P2P {
				continue
			}
			s := r.Call.Seq
			if rows[s] == nil {
				rows[s] = make([]cell, len(ds))
			}
			rows[s][i] = cell{r, true}
			if lo[i] == 0 || s < lo[i] {
				lo[i] = s
			}
			hi[i] = max(hi[i], s)
		}
	}
	seqs := make([]uint64, 0, len(rows))
	for s := range rows {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	first, why := uint64(0), ""
	for _, s := range seqs {
		var calls []CallInfo
		var names []string // calls[j] as the table names it, the caller's label first
		var sides [][]int
		var missing []int
		for i, c := range rows[s] {
			switch {
			case c.ok:
				j := slices.IndexFunc(calls, func(ci CallInfo) bool { return ci.sameCall(c.rec.Call) })
				if j < 0 {
					calls, sides = append(calls, c.rec.Call), append(sides, nil)
					names = append(names, c.rec.callName())
					j = len(calls) - 1
				}
				sides[j] = append(sides[j], ds[i].Rank)
			case hi[i] < s: // never got there (an older call is outside the window: unknown)
				missing = append(missing, ds[i].Rank)
			}
		}
		switch {
		case len(calls) > 1:
			parts := make([]string, len(calls))
			for j := range calls {
				parts[j] = fmt.Sprintf("%s called %s", rankList(sides[j]), names[j])
			}
			first, why = s, strings.Join(parts, ", ")
			if len(missing) > 0 {
				why += fmt.Sprintf("; %s never reached it", rankList(missing))
			}
		case len(missing) > 0:
			first, why = s, fmt.Sprintf("%s called %s; %s never reached it", rankList(sides[0]), names[0], rankList(missing))
		}
		if first != 0 {
			break
		}
	}
	fmt.Fprintf(b, "flight records of group %s (%d of %d ranks dumped):\n", group, len(ds), ds[0].Size)
	from := 0
	if first != 0 {
		from = max(0, slices.Index(seqs, first)-3)
	} else {
		from = max(0, len(seqs)-8)
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  \tseq")
	for _, d := range ds {
		fmt.Fprintf(tw, "\trank %d (%s)", d.Rank, d.Host)
	}
	fmt.Fprintln(tw, "\t")
	for _, s := range seqs[from:] {
		mark := "  "
		if s == first {
			mark = ">>"
		}
		fmt.Fprintf(tw, "%s\t#%d", mark, s)
		for i, c := range rows[s] {
			switch {
			case c.ok:
				fmt.Fprintf(tw, "\t%s", c.rec.cell())
			case hi[i] < s:
				fmt.Fprint(tw, "\t-")
			default:
				fmt.Fprint(tw, "\t?")
			}
		}
		fmt.Fprintln(tw, "\t")
	}
	_ = tw.Flush()
	if first != 0 {
		fmt.Fprintf(b, "first disagreement at #%d: %s\n", first, why)
	} else {
		fmt.Fprintln(b, "the ranks agree on every recorded call")
	}
}

// callName is the record's call as a disagreement names it: the call, after
// the caller's label when it has one ("all_gather_into_tensor AllGather(...)").
func (r FlightRecord) callName() string {
	if r.Label == "" {
		return r.Call.String()
	}
	return r.Label + " " + r.Call.String()
}

// cell is a record in a table: "AllReduce(float32 sum,16) done 12µs", with
// the caller's label first when it has one ("all_reduce AllReduce(...) ...").
func (r FlightRecord) cell() string {
	c := r.Call
	s := c.Kind.String() + "(" + c.DType.String()
	if r.Label != "" {
		s = r.Label + " " + s
	}
	if c.Op.Valid() {
		s += " " + c.Op.String()
	}
	s += fmt.Sprintf(",%d", c.Count)
	if c.Root >= 0 {
		s += fmt.Sprintf(",root=%d", c.Root)
	}
	s += ") " + string(r.State)
	if r.State != StateRunning {
		s += " " + r.Ended.Sub(r.Started).Round(time.Microsecond).String()
	}
	return s
}
