package buckets

import (
	"fmt"
	"math"
	"time"
)

// Sample is one measured collective, as `gorun bench` reports it.
type Sample struct {
	Op    Op
	Bytes int64 // per-rank input, as in Model.Time
	Ranks int
	Time  time.Duration
}

// Fit returns the model that best explains samples in the least-squares
// sense: time = Latency + busBytes/BusBandwidth, with the bus bytes of each
// sample computed as Model.Time does, so a sweep of any collective (or a mix
// of them) yields the two constants the planner needs. It needs at least two
// distinct sizes; a negative fitted latency (noise on a fast fabric) is
// clamped to zero.
func Fit(samples []Sample) (Model, error) {
	var n, sx, sy, sxx, sxy float64
	distinct := map[float64]bool{}
	for _, s := range samples {
		if s.Ranks <= 1 || s.Time <= 0 || s.Bytes < 0 {
			continue // a one-rank or empty measurement says nothing about the fabric
		}
		x := busBytes(s.Op, s.Bytes, s.Ranks)
		y := s.Time.Seconds()
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
		distinct[x] = true
	}
	if len(distinct) < 2 {
		return Model{}, fmt.Errorf("%w: need samples of at least two sizes on two or more ranks, have %d", ErrBadModel, len(distinct))
	}
	slope := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	if !(slope > 0) || math.IsInf(slope, 0) {
		return Model{}, fmt.Errorf("%w: time does not grow with size (slope %g s/B)", ErrBadModel, slope)
	}
	alpha := max((sy-slope*sx)/n, 0)
	return Model{Latency: time.Duration(math.Round(alpha * 1e9)), BusBandwidth: 1 / slope}, nil
}
