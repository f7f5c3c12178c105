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
