package bench

import (
	"bytes"
	"fmt"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// PlotConfig sizes the picture.
type PlotConfig struct {
	// Width and Height in pixels; 1400 × 560 holds the two panels (bus
	// bandwidth, latency) side by side at a readable font size.
	Width, Height int
	// Title heads both panels; empty: the operation and rank count.
	Title string
}

// DefaultPlotConfig returns the size used by --plot.
func DefaultPlotConfig() PlotConfig { return PlotConfig{Width: 1400, Height: 560} }

const plotDPI = 96

// WritePlot draws bus bandwidth and latency against size, log-log, one line
// per report, and writes a PNG to path. Points that a log axis cannot show
// (zero size or bandwidth, e.g. a barrier's) are left out.
func WritePlot(path string, reps []*Report, pc PlotConfig) error {
	var buf bytes.Buffer
	if err := drawPlot(&buf, reps, pc); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

func drawPlot(buf *bytes.Buffer, reps []*Report, pc PlotConfig) error {
	if pc.Width < 200 || pc.Height < 150 {
		return &UsageError{Problem: fmt.Sprintf("plot size %dx%d: at least 200x150 pixels", pc.Width, pc.Height)}
	}
	if len(reps) == 0 {
		return &UsageError{Problem: "nothing to plot"}
	}
	title := pc.Title
	if title == "" {
		title = fmt.Sprintf("%s, %d ranks", reps[0].Op, reps[0].Ranks)
	}
	bw, lat := plot.New(), plot.New()
	bw.Title.Text, lat.Title.Text = title+": bus bandwidth", title+": latency"
	bw.Y.Label.Text, lat.Y.Label.Text = "busbw (GB/s)", "time per call (µs)"
	for _, p := range []*plot.Plot{bw, lat} {
		p.X.Label.Text = "size (bytes)"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker = sizeTicks{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
	}
	// Bandwidth rises to the right and latency falls to the left, so these
	// corners stay clear of the lines.
	lat.Legend.Top, lat.Legend.Left = false, false
	drawn := 0
	for i, rep := range reps {
		var bws, lats plotter.XYs
		for j := range rep.Rows {
			row := &rep.Rows[j]
			m := row.Best()
			if m == nil || row.Bytes <= 0 {
				continue
			}
			if m.BusBW > 0 {
				bws = append(bws, plotter.XY{X: float64(row.Bytes), Y: m.BusBW})
			}
			if m.TimeUs > 0 {
				lats = append(lats, plotter.XY{X: float64(row.Bytes), Y: m.TimeUs})
			}
		}
		label := rep.Label
		if label == "" {
			label = fmt.Sprintf("series %d", i+1)
		}
		for _, s := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{bw, bws}, {lat, lats}} {
			if len(s.xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(s.xys)
			if err != nil {
				return fmt.Errorf("bench: plot %s: %w", label, err)
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
			pts.Color = l.Color
			pts.Shape = plotutil.Shape(i)
			s.p.Add(l, pts)
			s.p.Legend.Add(label, l, pts)
			drawn++
		}
	}
	if drawn == 0 {
		return &UsageError{Problem: "no positive sizes and values to plot on log axes"}
	}
	w := vg.Length(pc.Width) * vg.Inch / plotDPI
	h := vg.Length(pc.Height) * vg.Inch / plotDPI
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	cs := plot.Align([][]*plot.Plot{{bw, lat}}, tiles, dc)
	bw.Draw(cs[0][0])
	lat.Draw(cs[0][1])
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(buf); err != nil {
		return fmt.Errorf("bench: encoding PNG: %w", err)
	}
	return nil
}

// sizeTicks labels a log size axis at powers of two with binary suffixes
// (8, 1K, 1M), every other power when the range is wide.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 {
		lo = 1
	}
	if hi < lo {
		hi = lo
	}
	a, b := int(math.Floor(math.Log2(lo))), int(math.Ceil(math.Log2(hi)))
	step := 1
	for (b-a)/step > 12 {
		step *= 2
	}
	var ts []plot.Tick
	for e := a; e <= b; e++ {
		t := plot.Tick{Value: math.Exp2(float64(e))}
		if (e-a)%step == 0 {
			t.Label = FormatSize(int64(t.Value))
		}
		ts = append(ts, t)
	}
	return ts
}
