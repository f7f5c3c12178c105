package buckets

import (
	"fmt"
	"strings"
	"testing"
)

// TestFillerScenarios runs testdata/filler*.txt. Commands:
//
//	plan regions=a,b [cap=B] [flush=REGION,..]   items as in assign; resets the filler
//	ready T1 T2 ...    hand tensors in; prints the buckets that may start
//	end REGION         leave a region
//	finish             end the step (and reset when it succeeds)
//	reset              start a new step
func TestFillerScenarios(t *testing.T) {
	var f *Filler
	runScenarios(t, "testdata/filler*.txt", func(t *testing.T, sc scenario) string {
		switch sc.Cmd {
		case "plan":
			p := assignFrom(t, sc)
			for _, r := range strings.Split(sc.Args["flush"], ",") {
				for gi := range p.Groups {
					for bi := range p.Groups[gi].Buckets {
						if b := &p.Groups[gi].Buckets[bi]; r != "" && b.Region == r {
							b.Flush = true
						}
					}
				}
			}
			f = NewFiller(p)
			return p.String()
		case "ready", "end":
			var out []string
			for _, n := range sc.Words { // in command-line order

				var st []Startable
				var err error
				if sc.Cmd == "ready" {
					st, err = f.Ready(n)
				} else {
					st, err = f.EndRegion(n)
				}
				if err != nil {
					out = append(out, fmt.Sprintf("%s: error: %v", n, err))
					continue
				}
				line := n + ":"
				for _, s := range st {
					line += fmt.Sprintf(" start %s/%d", s.Group, s.Index)
					if len(s.Absent) > 0 {
						line += fmt.Sprintf(" (zeros for %s)", strings.Join(s.Absent, ","))
					}
				}
				out = append(out, line)
			}
			return strings.Join(out, "\n")
		case "reset":
			f.Reset()
			return "ok"
		case "finish":
			if err := f.Finish(); err != nil {
				return "error: " + err.Error()
			}
			f.Reset()
			return "ok"
		}
		t.Fatalf("%s: unknown command %s", sc.Pos, sc.Cmd)
		return ""
	})
}

// A shard gathered in forward and again in backward (reshard after
// forward) is handed in twice and fills its places in issue order.
func TestFillerTensorTravelsTwice(t *testing.T) {
	p := &Plan{Groups: []GroupPlan{{Group: "dp", Buckets: []Bucket{
		{Name: "ag", Op: AllGather, DType: "f32", Bytes: 8, Members: []Member{{Tensor: "w", Out: "W", Bytes: 8}}},
		{Name: "rs", Op: ReduceScatter, DType: "f32", Bytes: 8, Set: 1, Members: []Member{{Tensor: "g", Out: "G", Bytes: 8}}},
		{Name: "ag@bwd", Op: AllGather, DType: "f32", Bytes: 8, Set: 2, Members: []Member{{Tensor: "w", Out: "W@bwd", Bytes: 8}}},
	}}}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	f := NewFiller(p)
	var got []string
	for _, tensor := range []string{"w", "w", "g"} {
		st, err := f.Ready(tensor)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			got = append(got, s.Bucket.Name)
		}
	}
	// The second w fills ag@bwd, which must still wait for rs.
	if want := "ag rs ag@bwd"; strings.Join(got, " ") != want {
		t.Errorf("started %q, want %q", strings.Join(got, " "), want)
	}
	if err := f.Finish(); err != nil {
		t.Error(err)
	}
	if _, err := f.Ready("w"); err == nil {
		t.Error("a third w was accepted")
	}
}
