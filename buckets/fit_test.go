package buckets

import (
	"errors"
	"testing"
	"time"
)

func TestFitRecoversModel(t *testing.T) {
	want := Model{Latency: 19 * time.Microsecond, BusBandwidth: 0.8e9}
	var samples []Sample
	for _, b := range []int64{8, 1 << 10, 1 << 16, 1 << 20, 1 << 24} {
		samples = append(samples, Sample{Op: AllReduce, Bytes: b, Ranks: 2, Time: want.Time(AllReduce, b, 2)})
		samples = append(samples, Sample{Op: AllGather, Bytes: b, Ranks: 4, Time: want.Time(AllGather, b, 4)})
	}
	got, err := Fit(samples)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Latency - want.Latency; d < -time.Microsecond/10 || d > time.Microsecond/10 {
		t.Errorf("latency %v, want %v", got.Latency, want.Latency)
	}
	if r := got.BusBandwidth / want.BusBandwidth; r < 0.999 || r > 1.001 {
		t.Errorf("bandwidth %g, want %g", got.BusBandwidth, want.BusBandwidth)
	}
}

func TestFitRefusesUselessSamples(t *testing.T) {
	for name, s := range map[string][]Sample{
		"empty":     nil,
		"one size":  {{AllReduce, 8, 2, time.Microsecond}, {AllReduce, 8, 2, 2 * time.Microsecond}},
		"one rank":  {{AllReduce, 8, 1, time.Microsecond}, {AllReduce, 1 << 20, 1, time.Millisecond}},
		"shrinking": {{AllReduce, 8, 2, time.Millisecond}, {AllReduce, 1 << 20, 2, time.Microsecond}},
	} {
		if _, err := Fit(s); !errors.Is(err, ErrBadModel) {
			t.Errorf("%s: Fit = %v, want ErrBadModel", name, err)
		}
	}
}
