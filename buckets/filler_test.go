package buckets

import (
	"errors"
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
//
// Every scenario also drives a twin filler through ReadyAt, handed the
// place Ready fills (the first unfilled one), and fails where the two
// disagree.
func TestFillerScenarios(t *testing.T) {
	var f, twin *Filler
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
			f, twin = NewFiller(p), NewFiller(p)
			return p.String()
		case "ready", "end":
			var out []string
			for _, n := range sc.Words { // in command-line order

				var st []Startable
				var err error
				var tst []Startable
				var terr error
				if sc.Cmd == "ready" {
					st, err = f.Ready(n)
					if gi, bi, mi, ok := twin.firstUnfilled(n); ok {
						tst, terr = twin.ReadyAt(gi, bi, mi)
					} else {
						tst, terr = twin.Ready(n) // no place: the same error
					}
				} else {
					st, err = f.EndRegion(n)
					tst, terr = twin.EndRegion(n)
				}
				if a, b := fmt.Sprint(st, err), fmt.Sprint(tst, terr); a != b {
					t.Errorf("%s: %s %s: Ready gave %s, ReadyAt %s", sc.Pos, sc.Cmd, n, a, b)
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
			twin.Reset()
			return "ok"
		case "finish":
			if err := f.Finish(); err != nil {
				return "error: " + err.Error()
			}
			f.Reset()
			twin.Reset()
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

// firstUnfilled is the place Ready would fill for tensor.
func (f *Filler) firstUnfilled(tensor string) (gi, bi, mi int, ok bool) {
	for _, l := range f.index[tensor] {
		gi := f.group[l.Group]
		if !f.filled[gi][l.Bucket][l.Member] {
			return gi, l.Bucket, l.Member, true
		}
	}
	return 0, 0, 0, false
}

// ReadyAt refuses a place out of range and a place already filled.
func TestFillerReadyAtRefuses(t *testing.T) {
	p := &Plan{Groups: []GroupPlan{{Group: "dp", Buckets: []Bucket{
		{Name: "ar", Op: AllReduce, DType: "f32", Bytes: 16, Members: []Member{{Tensor: "a", Out: "a", Bytes: 8}, {Tensor: "b", Out: "b", Offset: 8, Bytes: 8}}},
	}}}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	f := NewFiller(p)
	for _, at := range [][3]int{{1, 0, 0}, {0, 1, 0}, {0, 0, 2}, {-1, 0, 0}} {
		if _, err := f.ReadyAt(at[0], at[1], at[2]); !errors.Is(err, ErrUnknownTensor) {
			t.Errorf("ReadyAt%v: %v, want ErrUnknownTensor", at, err)
		}
	}
	if st, err := f.ReadyAt(0, 0, 1); err != nil || len(st) != 0 {
		t.Fatalf("ReadyAt b: %v %v, want nothing startable", st, err)
	}
	if _, err := f.ReadyAt(0, 0, 1); !errors.Is(err, ErrTwice) || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("b again: %v, want ErrTwice naming b", err)
	}
	if st, err := f.ReadyAt(0, 0, 0); err != nil || len(st) != 1 || st[0].Bucket.Name != "ar" {
		t.Errorf("ReadyAt a: %v %v, want ar startable", st, err)
	}
}
