package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Ratio asks the comparison table for Num's busbw divided by Den's
// (indexes into the reports).
type Ratio struct{ Num, Den int }

// DefaultRatios compares every gorun series with every other series: what a
// reader of "gorun vs MPI vs gloo" wants to see.
func DefaultRatios(reps []*Report) []Ratio {
	var out []Ratio
	for i, a := range reps {
		if a.Source != "gorun" {
			continue
		}
		for j, b := range reps {
			if j != i && b.Source != "gorun" {
				out = append(out, Ratio{i, j})
			}
		}
	}
	if len(out) == 0 {
		for j := 1; j < len(reps); j++ {
			out = append(out, Ratio{0, j})
		}
	}
	return out
}

// WriteComparison prints bus bandwidth per size for every report, side by
// side, with the requested ratios, then the time per call the same way
// (small sizes are latency bound, where busbw says little). Sizes are matched exactly; a series
// without a size shows "-". Each series uses its better placement (the
// other tools report one number per size).
func WriteComparison(w io.Writer, reps []*Report, ratios []Ratio) {
	var sizes []int64
	idx := make([]map[int64]*Measure, len(reps))
	for i, r := range reps {
		idx[i] = map[int64]*Measure{}
		for j := range r.Rows {
			row := &r.Rows[j]
			if m := row.Best(); m != nil {
				idx[i][row.Bytes] = m
				if !slices.Contains(sizes, row.Bytes) {
					sizes = append(sizes, row.Bytes)
				}
			}
		}
	}
	slices.Sort(sizes)
	ratioName := func(q Ratio) string { return reps[q.Num].Label + " / " + reps[q.Den].Label }
	fmt.Fprintln(w, "# busbw (GB/s) per size; ratios of busbw (> 1: the first is faster)")
	for i, r := range reps {
		fmt.Fprintf(w, "# [%d] %s: %s, %d ranks, source %s\n", i+1, r.Label, r.Op, r.Ranks, r.Source)
	}
	for k, q := range ratios {
		fmt.Fprintf(w, "# (%c) %s\n", 'a'+k, ratioName(q))
	}
	writeColumns(w, sizes, idx, ratios, 7, func(m *Measure) string { return fmt.Sprintf("%10.4f", m.BusBW) },
		func(a, b *Measure) (string, bool) {
			return fmt.Sprintf("%7.2f", a.BusBW/b.BusBW), b.BusBW > 0
		})
	fmt.Fprintln(w, "#")
	// The ratios' columns here are differences: the microseconds the first
	// series adds to each call over the second (negative: it saves them),
	// the figure a per-call overhead goal is stated in.
	fmt.Fprintln(w, "# time per call (us), max over ranks of the mean; (x): us added per call, first minus second")
	writeColumns(w, sizes, idx, ratios, 8, func(m *Measure) string { return fmt.Sprintf("%10.1f", m.TimeUs) },
		func(a, b *Measure) (string, bool) { return fmt.Sprintf("%+8.1f", a.TimeUs-b.TimeUs), true })
}

// writeColumns prints one table of WriteComparison: a header, then per size
// each series' value (10 wide) and each ratio column (ratioW wide), "-"
// where a series lacks the size or ratio says its value does not exist.
func writeColumns(w io.Writer, sizes []int64, idx []map[int64]*Measure, ratios []Ratio, ratioW int,
	value func(*Measure) string, ratio func(a, b *Measure) (string, bool)) {
	var hdr strings.Builder
	fmt.Fprintf(&hdr, "# %10s", "size")
	for i := range idx {
		fmt.Fprintf(&hdr, "  %10s", fmt.Sprintf("[%d]", i+1))
	}
	for k := range ratios {
		fmt.Fprintf(&hdr, "  %*s", ratioW, fmt.Sprintf("(%c)", 'a'+k))
	}
	fmt.Fprintln(w, hdr.String())
	for _, s := range sizes {
		fmt.Fprintf(w, "%12s", FormatSize(s))
		for i := range idx {
			if m := idx[i][s]; m != nil {
				fmt.Fprintf(w, "  %s", value(m))
			} else {
				fmt.Fprintf(w, "  %10s", "-")
			}
		}
		for _, q := range ratios {
			a, b := idx[q.Num][s], idx[q.Den][s]
			text, ok := "", a != nil && b != nil
			if ok {
				text, ok = ratio(a, b)
			}
			if !ok {
				text = fmt.Sprintf("%*s", ratioW, "-")
			}
			fmt.Fprintf(w, "  %s", text)
		}
		fmt.Fprintln(w)
	}
}

// MergeBest folds reports that share a label into one series keeping, per
// size, the fastest measurement: on a shared machine the best of a few
// interleaved rounds is the number least disturbed by other work, as
// microbenchmarks usually report. Order follows each label's first report.
func MergeBest(reps []*Report) []*Report {
	var out []*Report
	byLabel := map[string]*Report{}
	for _, r := range reps {
		m, ok := byLabel[r.Label]
		if !ok {
			c := *r
			c.Rows = append([]Row(nil), r.Rows...)
			byLabel[r.Label] = &c
			out = append(out, &c)
			continue
		}
		at := map[int64]int{}
		for i, row := range m.Rows {
			at[row.Bytes] = i
		}
		for _, row := range r.Rows {
			i, ok := at[row.Bytes]
			switch {
			case !ok:
				m.Rows = append(m.Rows, row)
			case faster(row.Best(), m.Rows[i].Best()):
				m.Rows[i] = row
			}
		}
		m.Wrong += r.Wrong
	}
	for _, m := range out {
		slices.SortFunc(m.Rows, func(a, b Row) int { return int(a.Bytes - b.Bytes) })
		m.finish()
	}
	return out
}

func faster(a, b *Measure) bool {
	return a != nil && (b == nil || (a.TimeUs > 0 && a.TimeUs < b.TimeUs))
}
