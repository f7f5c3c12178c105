package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// FormatVersion names the JSON layout written by WriteJSON.
const FormatVersion = "gorun-bench/1"

// Report is one benchmark's results: a run of gorun bench, or a result file
// of another tool read back by ReadFile. It is what WriteJSON writes.
type Report struct {
	Format string `json:"format"` // FormatVersion
	// Source is the tool that produced the numbers: "gorun", "nccl-tests"
	// (also our own text, which has its layout), "osu".
	Source string `json:"source"`
	// Label names the series in tables and plots; for a gorun run,
	// "gorun <transport>".
	Label   string `json:"label"`
	Version string `json:"version,omitempty"` // gorun version
	Date    string `json:"date,omitempty"`    // RFC 3339, when the run started

	Op        string     `json:"op"`
	Ranks     int        `json:"ranks"`
	Transport string     `json:"transport,omitempty"` // requested: auto, tcp, shm
	Hosts     []RankInfo `json:"hosts,omitempty"`     // one per rank

	DType      string `json:"type,omitempty"`
	RedOp      string `json:"redop,omitempty"`
	Root       int    `json:"root"`
	MinBytes   int64  `json:"min_bytes"`
	MaxBytes   int64  `json:"max_bytes"`
	StepFactor int64  `json:"step_factor,omitempty"`
	StepBytes  int64  `json:"step_bytes,omitempty"`
	Iters      int    `json:"iters,omitempty"`
	Warmup     int    `json:"warmup,omitempty"`
	Check      bool   `json:"check"`
	Blocking   bool   `json:"blocking,omitempty"`

	Rows []Row `json:"rows"`
	// Wrong is the total of wrong elements; AvgBusBW the mean bus bandwidth
	// over every measured row and placement, as nccl-tests' footer.
	Wrong    int64   `json:"wrong"`
	AvgBusBW float64 `json:"avg_busbw_gbps"`

	isRank0 bool // set by RunRank: this process writes the outputs
}

// Row is one size, with the nccl-tests columns.
type Row struct {
	Bytes int64  `json:"bytes"` // the size column: the larger buffer
	Count int64  `json:"count"` // elements (per rank for gather/scatter/all-to-all)
	Type  string `json:"type"`
	RedOp string `json:"redop"`
	Root  int    `json:"root"` // -1 when the operation has none
	// OutOfPlace and InPlace are nil where not measured (N/A).
	OutOfPlace *Measure `json:"out_of_place,omitempty"`
	InPlace    *Measure `json:"in_place,omitempty"`
}

// Measure is one placement's numbers.
type Measure struct {
	TimeUs float64 `json:"time_us"`    // max over ranks of the mean per iteration
	AlgBW  float64 `json:"algbw_gbps"` // 1e9 bytes per second
	BusBW  float64 `json:"busbw_gbps"` // AlgBW times the operation's bus factor
	Wrong  int64   `json:"wrong"`      // wrong elements over ranks; -1 not checked
}

func (r *Row) wrong() int64 {
	var w int64
	for _, m := range []*Measure{r.OutOfPlace, r.InPlace} {
		if m != nil && m.Wrong > 0 {
			w += m.Wrong
		}
	}
	return w
}

// Best is the placement with the higher bus bandwidth (nil if none): what a
// side-by-side comparison uses, since other tools report one number.
func (r *Row) Best() *Measure {
	a, b := r.OutOfPlace, r.InPlace
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case b.BusBW > a.BusBW:
		return b
	}
	return a
}

func newReport(cfg *Config, n int, ranks []RankInfo, kinds []string) *Report {
	rep := &Report{
		Format: FormatVersion, Source: "gorun", Version: cfg.Version,
		Date: time.Now().UTC().Format(time.RFC3339),
		Op:   cfg.Op.String(), Ranks: n, Transport: string(cfg.Transport),
		DType: ncclTypeName(cfg.DType), RedOp: "none", Root: -1,
		MinBytes: cfg.MinBytes, MaxBytes: cfg.MaxBytes, StepFactor: cfg.StepFactor, StepBytes: cfg.StepBytes,
		Iters: cfg.Iters, Warmup: cfg.Warmup, Check: cfg.Check, Blocking: cfg.Blocking,
	}
	if cfg.StepBytes > 0 {
		rep.StepFactor = 0
	}
	if cfg.Op.Reduces() {
		rep.RedOp = cfg.RedOp.String()
	}
	if cfg.Op.Rooted() {
		rep.Root = cfg.Root
	}
	rep.Hosts = make([]RankInfo, n)
	for i := range n {
		if i < len(ranks) {
			rep.Hosts[i] = ranks[i]
		}
		rep.Hosts[i].Rank = i
		if i < len(kinds) {
			rep.Hosts[i].Transport = kinds[i]
		}
	}
	rep.Label = "gorun " + rep.linkSummary()
	return rep
}

// linkSummary is the transport actually used: the ranks' link kinds when
// they agree, else "mixed".
func (r *Report) linkSummary() string {
	s := ""
	for _, h := range r.Hosts {
		switch {
		case s == "":
			s = h.Transport
		case s != h.Transport:
			return "mixed"
		}
	}
	if s == "" {
		return r.Transport
	}
	return s
}

func (r *Report) add(row Row) {
	r.Rows = append(r.Rows, row)
	r.Wrong += row.wrong()
}

func (r *Report) finish() {
	var sum float64
	var k int
	for i := range r.Rows {
		for _, m := range []*Measure{r.Rows[i].OutOfPlace, r.Rows[i].InPlace} {
			if m != nil {
				sum += m.BusBW
				k++
			}
		}
	}
	if k > 0 {
		r.AvgBusBW = sum / float64(k)
	}
}

// WriteJSON writes r, indented, to w.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteJSONFile writes r to path.
func (r *Report) WriteJSONFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := r.WriteJSON(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: writing %s: %w", path, err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(rd io.Reader) (*Report, error) {
	var r Report
	dec := json.NewDecoder(rd)
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: JSON: %v", ErrFormat, err)
	}
	if r.Format != FormatVersion {
		return nil, fmt.Errorf("%w: JSON format %q, expected %q", ErrFormat, r.Format, FormatVersion)
	}
	return &r, nil
}
