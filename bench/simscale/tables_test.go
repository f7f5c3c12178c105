package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/sim"
)

// scaleCosts multiplies every CPU cost (each time.Duration field of
// sim.Costs) and nothing else: the ×2 rows and the loaded calibration
// rows rest on it, and a cost left out would run at its measured figure
// there. SSHWall is a wall time and the wake excess a latency: not CPU.
func TestScaleCostsScalesEveryCPUCost(t *testing.T) {
	var c sim.Costs
	v := reflect.ValueOf(&c).Elem()
	dur := reflect.TypeOf(time.Duration(0))
	for i := range v.NumField() {
		if v.Field(i).Type() == dur {
			v.Field(i).SetInt(1000)
		}
	}
	s := reflect.ValueOf(scaleCosts(c, 2))
	notCPU := map[string]bool{"SSHWall": true}
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type != dur {
			continue
		}
		want := int64(2000)
		if notCPU[f.Name] {
			want = 1000
		}
		if got := s.Field(i).Int(); got != want {
			t.Errorf("scaleCosts(×2) left %s at %d ns, want %d", f.Name, got, want)
		}
	}
}
