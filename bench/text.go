package bench

import (
	"fmt"
	"io"
	"strconv"
)

// The table follows nccl-tests (src/common.cu in NVIDIA/nccl-tests) column for
// column, so scripts written for it read ours: size and count, type, redop,
// root, then time (µs), algbw and busbw (GB/s) and #wrong for out-of-place
// and in-place; "N/A" where a value does not exist.

func writeHeader(w io.Writer, r *Report) {
	fmt.Fprintf(w, "# gorun bench %s (gorun %s)\n", r.Op, r.Version)
	step := fmt.Sprintf("%d(factor)", r.StepFactor)
	if r.StepBytes > 0 {
		step = fmt.Sprintf("%d(bytes)", r.StepBytes)
	}
	check := 0
	if r.Check {
		check = 1
	}
	blocking := ""
	if r.Blocking {
		blocking = " blocking: 1"
	}
	fmt.Fprintf(w, "# nRanks %d minBytes %d maxBytes %d step: %s warmup iters: %d iters: %d validation: %d transport: %s%s\n",
		r.Ranks, r.MinBytes, r.MaxBytes, step, r.Warmup, r.Iters, check, r.Transport, blocking)
	if op, err := ParseCollective(r.Op); err == nil && r.Ranks == 1 && op.BusFactor(1) == 0 {
		// Started without gorun, the benchmark is one rank: nothing
		// crosses a link, and a column of zeros would read as a fault.
		fmt.Fprintf(w, "# one rank: busbw is 0 (no data crosses a link); run it under gorun, e.g. gorun -np 4 gorun bench %s\n", r.Op)
	}
	fmt.Fprintln(w, "#")
	fmt.Fprintln(w, "# Using ranks")
	for _, h := range r.Hosts {
		dev := ""
		if h.Device != "" {
			dev = " device " + h.Device // nccl-tests' place for it
		}
		fmt.Fprintf(w, "#  Rank %2d Pid %6d on %10s%s transport %s\n", h.Rank, h.PID, h.Host, dev, h.Transport)
	}
	fmt.Fprintln(w, "#")
	fmt.Fprintf(w, "# %60s%-35s%s\n", "", "out-of-place", "in-place")
	fmt.Fprintf(w, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
		"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(w, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
		"(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
}

// timeText formats microseconds as nccl-tests does: fewer decimals for
// longer times, so the column keeps its width.
func timeText(us float64) string {
	switch {
	case us >= 10000:
		return fmt.Sprintf("%7.0f", us)
	case us >= 100:
		return fmt.Sprintf("%7.1f", us)
	}
	return fmt.Sprintf("%7.2f", us)
}

func writeRow(w io.Writer, row *Row) {
	fmt.Fprintf(w, "%12d  %12d  %8s  %6s  %6d", row.Bytes, row.Count, row.Type, row.RedOp, row.Root)
	for _, m := range []*Measure{row.OutOfPlace, row.InPlace} {
		if m == nil {
			fmt.Fprintf(w, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A")
			continue
		}
		wrong := "N/A"
		if m.Wrong >= 0 {
			wrong = strconv.FormatInt(m.Wrong, 10)
		}
		fmt.Fprintf(w, "  %7s  %6.2f  %6.2f  %6s", timeText(m.TimeUs), m.AlgBW, m.BusBW, wrong)
	}
	fmt.Fprintln(w)
}

func writeFooter(w io.Writer, r *Report) {
	status := "OK"
	if r.Wrong > 0 {
		status = "FAILED"
	}
	fmt.Fprintf(w, "# Out of bounds values : %d %s\n", r.Wrong, status)
	fmt.Fprintf(w, "# Avg bus bandwidth    : %.6g \n", r.AvgBusBW)
	fmt.Fprintln(w, "#")
}

// WriteText writes r as the table Run prints.
func (r *Report) WriteText(w io.Writer) {
	writeHeader(w, r)
	for i := range r.Rows {
		writeRow(w, &r.Rows[i])
	}
	writeFooter(w, r)
}
