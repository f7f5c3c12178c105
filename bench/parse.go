package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// ParseOptions fill in what a result file may not say.
type ParseOptions struct {
	// Label names the series; empty: derived from the file.
	Label string
	// Op is the collective when the file does not name it (nccl-tests'
	// output does not; its binary's name does). Zero: guess from the file
	// name, else all-reduce.
	Op Collective
	// Ranks is the rank count when the file does not give it (OSU does
	// not), needed to turn OSU latencies into bus bandwidth. Zero: 2.
	Ranks int
}

// ReadFile reads a result file of any supported kind: our JSON, our text,
// nccl-tests text, or OSU micro-benchmark text. path may be LABEL=PATH to
// name the series.
func ReadFile(path string, opts ParseOptions) (*Report, error) {
	if label, p, ok := strings.Cut(path, "="); ok && label != "" && !strings.ContainsRune(label, os.PathSeparator) {
		if _, err := os.Stat(path); err != nil { // a file really named a=b wins
			opts.Label, path = label, p
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if opts.Op == 0 {
		opts.Op = opFromText(filepath.Base(path))
	}
	rep, err := Parse(bytes.NewReader(data), opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if rep.Label == "" {
		rep.Label = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	return rep, nil
}

// Parse reads a result from rd, detecting its kind from the content.
func Parse(rd io.Reader, opts ParseOptions) (*Report, error) {
	data, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	trimmed := bytes.TrimSpace(data)
	var rep *Report
	switch {
	case bytes.HasPrefix(trimmed, []byte("{")):
		rep, err = ReadJSON(bytes.NewReader(trimmed))
	case osuTitle.Match(data):
		rep, err = ParseOSU(bytes.NewReader(data), opts)
	default:
		rep, err = ParseText(bytes.NewReader(data), opts)
	}
	if err != nil {
		return nil, err
	}
	if opts.Label != "" {
		rep.Label = opts.Label
	}
	return rep, nil
}

// tagPrefix matches the per-line prefixes of launchers' tagged output:
// mpirun --tag-output's "[1,0]<stdout>:" and gorun's "[0] ".
var tagPrefix = regexp.MustCompile(`^\[[0-9,]+\](<std(out|err)>:)?\s?`)

func cleanLines(rd io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, strings.TrimSpace(tagPrefix.ReplaceAllString(sc.Text(), "")))
	}
	return out, sc.Err()
}

var opWords = regexp.MustCompile(`(?i)(all[_-]?reduce|all[_-]?gather|reduce[_-]?scatter|broadcast|bcast|all[_-]?to[_-]?all|alltoall|send[_-]?recv|barrier|reduce)`)

// opFromText finds a collective's name in s (a header line, a file name).
func opFromText(s string) Collective {
	m := opWords.FindString(s)
	if m == "" {
		return 0
	}
	if strings.EqualFold(m, "bcast") {
		return Broadcast
	}
	c, err := ParseCollective(m)
	if err != nil {
		return 0
	}
	return c
}

var (
	ourTitle  = regexp.MustCompile(`^# gorun bench (\S+) \(gorun (\S+)\)`)
	nRanks    = regexp.MustCompile(`nRanks (\d+)`)
	rankLine  = regexp.MustCompile(`^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)(?:.*transport (\S+))?`)
	ncclParam = regexp.MustCompile(`minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\) warmup iters: (\d+) iters: (\d+)(?: agg iters: \d+)? validation: (\d+)`)
	transp    = regexp.MustCompile(`transport: (\S+)`)
	blockingL = regexp.MustCompile(`blocking: 1\b`)
	footerAvg = regexp.MustCompile(`^# Avg bus bandwidth\s*:\s*(\S+)`)
)

// ParseText reads the nccl-tests table: nccl-tests' own output (v2.x, with or
// without the root column), ours, and that of the Open MPI and gloo
// programs of scripts/bench-compare.sh. Header lines are optional; only
// the rows are required.
//
// nccl-tests prints bandwidths with two decimals, which is 0.00 for small
// sizes; where the operation and rank count are known, algbw and busbw are
// recomputed from the size and the time, which keep more digits.
func ParseText(rd io.Reader, opts ParseOptions) (*Report, error) {
	lines, err := cleanLines(rd)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep := &Report{Format: FormatVersion, Source: "nccl-tests", Root: -1, Check: true}
	op := opts.Op
	var ranks int
	seenColumns := false
	for i, l := range lines {
		if !strings.HasPrefix(l, "#") {
			if l == "" {
				continue
			}
			row, ok, err := parseRow(l)
			if err != nil {
				return nil, fmt.Errorf("%w: line %d: %v", ErrFormat, i+1, err)
			}
			if ok {
				rep.Rows = append(rep.Rows, row)
			}
			continue
		}
		if m := ourTitle.FindStringSubmatch(l); m != nil {
			rep.Source, rep.Version = "gorun", m[2]
			if c, err := ParseCollective(m[1]); err == nil {
				op = c
			}
		} else if c := opFromText(l); c != 0 && !seenColumns && op == opts.Op {
			// A title line naming the collective (newer nccl-tests print
			// "# Collective test starting: all_reduce_perf"); the caller's
			// guess from the file name yields to it.
			op = c
		}
		if strings.Contains(l, "size") && strings.Contains(l, "count") {
			seenColumns = true
		}
		if m := nRanks.FindStringSubmatch(l); m != nil {
			ranks, _ = strconv.Atoi(m[1])
		}
		if m := rankLine.FindStringSubmatch(l); m != nil {
			r, _ := strconv.Atoi(m[1])
			pid, _ := strconv.Atoi(m[2])
			rep.Hosts = append(rep.Hosts, RankInfo{Rank: r, PID: pid, Host: m[3], Transport: m[4]})
		}
		if m := ncclParam.FindStringSubmatch(l); m != nil {
			rep.MinBytes, _ = strconv.ParseInt(m[1], 10, 64)
			rep.MaxBytes, _ = strconv.ParseInt(m[2], 10, 64)
			step, _ := strconv.ParseInt(m[3], 10, 64)
			if m[4] == "factor" {
				rep.StepFactor = step
			} else {
				rep.StepBytes = step
			}
			rep.Warmup, _ = strconv.Atoi(m[5])
			rep.Iters, _ = strconv.Atoi(m[6])
			rep.Check = m[7] != "0"
		}
		if m := transp.FindStringSubmatch(l); m != nil {
			rep.Transport = m[1]
		}
		if strings.HasPrefix(l, "#") && blockingL.MatchString(l) {
			rep.Blocking = true
		}
		if m := footerAvg.FindStringSubmatch(l); m != nil {
			rep.AvgBusBW, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	if len(rep.Rows) == 0 {
		return nil, fmt.Errorf("%w: no result rows (expected the nccl-tests table)", ErrFormat)
	}
	if op == 0 {
		op = AllReduce
	}
	rep.Op = op.String()
	if ranks == 0 {
		ranks = len(rep.Hosts)
	}
	rep.Ranks = ranks
	first := rep.Rows[0]
	rep.DType, rep.RedOp, rep.Root = first.Type, first.RedOp, first.Root
	factor := busFactorOf(rep.Rows, op, ranks)
	for i := range rep.Rows {
		row := &rep.Rows[i]
		rep.Wrong += row.wrong()
		if factor < 0 {
			continue
		}
		for _, m := range []*Measure{row.OutOfPlace, row.InPlace} {
			if m != nil && m.TimeUs > 0 {
				m.AlgBW = float64(row.Bytes) / (m.TimeUs * 1e-6) / 1e9
				m.BusBW = m.AlgBW * factor
			}
		}
	}
	if rep.Source == "gorun" && rep.Transport != "" {
		rep.Label = "gorun " + rep.linkSummary()
	}
	return rep, nil
}

// busFactorOf finds the busbw/algbw factor of a parsed table: from the
// printed numbers of its largest row (the printed rank count can be wrong:
// old nccl-tests list one line per process, not per GPU), snapped to the
// operation's factor for the printed rank count when they agree within the
// printing precision; -1 when neither is known (the printed numbers are
// then kept).
func busFactorOf(rows []Row, op Collective, ranks int) float64 {
	known := -1.0
	if ranks > 0 {
		known = op.BusFactor(ranks)
	}
	var best *Measure
	for i := range rows {
		if m := rows[i].OutOfPlace; m != nil && m.AlgBW >= 0.1 && (best == nil || m.AlgBW > best.AlgBW) {
			best = m
		}
	}
	if best == nil {
		return known
	}
	// Two printed decimals: each number is off by up to 0.005.
	f := best.BusBW / best.AlgBW
	slack := 0.01 + 0.006/best.AlgBW + 0.006/math.Max(best.BusBW, 0.01)
	switch {
	case known > 0 && math.Abs(f-known) <= slack*known:
		return known
	case known > 0 && best.AlgBW < 1:
		return known // too few digits to overrule the rank count
	}
	return f
}

// parseRow reads one table row. ok is false for lines that are not rows
// (other programs' chatter between them).
func parseRow(l string) (Row, bool, error) {
	f := strings.Fields(l)
	var row Row
	var rest []string
	switch len(f) {
	case 13: // size count type redop root + 2 × (time algbw busbw wrong)
		rest = f[5:]
		root, err := strconv.Atoi(f[4])
		if err != nil {
			return row, false, fmt.Errorf("root %q", f[4])
		}
		row.Root = root
	case 12: // nccl-tests before the root column
		rest = f[4:]
		row.Root = -1
	default:
		return row, false, nil
	}
	var err error
	if row.Bytes, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return row, false, nil
	}
	if row.Count, err = strconv.ParseInt(f[1], 10, 64); err != nil {
		return row, false, fmt.Errorf("count %q", f[1])
	}
	row.Type, row.RedOp = f[2], f[3]
	for p := range 2 {
		m, err := parseMeasure(rest[4*p : 4*p+4])
		if err != nil {
			return row, false, err
		}
		if p == 0 {
			row.OutOfPlace = m
		} else {
			row.InPlace = m
		}
	}
	return row, true, nil
}

func parseMeasure(f []string) (*Measure, error) {
	if f[0] == "N/A" {
		return nil, nil
	}
	var m Measure
	var err error
	for i, dst := range []*float64{&m.TimeUs, &m.AlgBW, &m.BusBW} {
		if *dst, err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil, fmt.Errorf("number %q", f[i])
		}
	}
	switch w := f[3]; {
	case w == "N/A":
		m.Wrong = -1
	default:
		// Old nccl-tests print the max error as a float ("0e+00").
		v, err := strconv.ParseFloat(w, 64)
		if err != nil {
			return nil, fmt.Errorf("#wrong %q", w)
		}
		m.Wrong = int64(v)
		if v > 0 && m.Wrong == 0 {
			m.Wrong = 1
		}
	}
	return &m, nil
}

var (
	osuTitle = regexp.MustCompile(`(?m)^#\s*OSU (?:MPI|OpenSHMEM|UPC|NCCL|Python)?[^\n]*Test`)
	osuCols  = regexp.MustCompile(`^#\s*Size\s+(.*)$`)
)

// ParseOSU reads the output of an OSU micro-benchmark: collective latency
// tests (osu_allreduce...: "Size  Avg Latency(us) ..."), osu_latency
// ("Size  Latency (us)", one-way) and osu_bw/osu_bibw ("Size  Bandwidth
// (MB/s)"). OSU sizes collective messages per rank; they are converted to
// nccl-tests' sizes (times the rank count for all-gather and all-to-all), so
// bandwidths compare.
func ParseOSU(rd io.Reader, opts ParseOptions) (*Report, error) {
	lines, err := cleanLines(rd)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	ranks := opts.Ranks
	if ranks <= 0 {
		ranks = 2
	}
	rep := &Report{Format: FormatVersion, Source: "osu", Ranks: ranks, Root: -1}
	op := opts.Op
	bandwidth := false
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			if osuTitle.MatchString(l) {
				// Collective tests name their collective; osu_latency and
				// osu_bw are point to point.
				if c := opFromText(l); c != 0 {
					op = c
				} else {
					op = SendRecv
				}
				rep.Label = strings.TrimSpace(strings.TrimPrefix(l, "#"))
			}
			if m := osuCols.FindStringSubmatch(l); m != nil {
				bandwidth = strings.Contains(m[1], "MB/s")
			}
			continue
		}
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		size, err1 := strconv.ParseInt(f[0], 10, 64)
		v, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: OSU line %d: %q", ErrFormat, i+1, l)
		}
		if op == 0 {
			op = AllReduce
		}
		bytes := size
		if op == AllGather || op == AllToAll {
			bytes = size * int64(ranks)
		}
		m := &Measure{Wrong: -1}
		if bandwidth {
			m.AlgBW = v / 1e3 // MB/s of 1e6 bytes
			if v > 0 {
				m.TimeUs = float64(size) / v // bytes / (MB/s) = µs
			}
		} else {
			m.TimeUs = v
			if v > 0 {
				m.AlgBW = float64(bytes) / (v * 1e-6) / 1e9
			}
		}
		m.BusBW = m.AlgBW * op.BusFactor(ranks)
		rep.Rows = append(rep.Rows, Row{Bytes: bytes, Count: size, Type: "byte", RedOp: "none", Root: -1, OutOfPlace: m})
	}
	if len(rep.Rows) == 0 {
		return nil, fmt.Errorf("%w: no OSU result rows", ErrFormat)
	}
	rep.Op = op.String()
	rep.finish()
	return rep, nil
}
