package mpi

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// topoLine is hwlocprog's line per rank (testdata/hwlocprog.c).
var topoLine = regexp.MustCompile(`(?m)^rank (\d+) madeby (\S+) thissystem (\d) pus (\d+) pcidevs (\d+) osdevs (\d+) xmlfile (\S+)$`)

type rankTopology struct {
	madeBy, thisSystem, xmlFile string
	counts                      string // "pus pcidevs osdevs"
}

// runTopology runs hwlocprog under gorun and returns each rank's line.
func runTopology(t *testing.T, np int, args ...string) map[int]rankTopology {
	t.Helper()
	r := newRun(t, append(append([]string{"-np", strconv.Itoa(np)}, args...), hwlocProg)...)
	r.start()
	if code := r.wait(); code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, r.stdout.String(), r.stderr.String())
	}
	r.noSurvivors()
	got := map[int]rankTopology{}
	for _, m := range topoLine.FindAllStringSubmatch(r.stdout.String(), -1) {
		rank, _ := strconv.Atoi(m[1])
		got[rank] = rankTopology{madeBy: m[2], thisSystem: m[3], xmlFile: m[7], counts: strings.Join(m[4:7], " ")}
	}
	if len(got) != np {
		t.Fatalf("%d ranks reported a topology, want %d\nstdout:\n%s\nstderr:\n%s", len(got), np, r.stdout.String(), r.stderr.String())
	}
	return got
}

// TestSharedTopology: the ranks of an MPICH program read the hwloc
// topology their host's supervisor discovered once
// (launcher/supervisor/topology.go) instead of each discovering it, and see the
// same machine as when they discover it themselves; --topology off and a user's
// own hwloc settings leave them to their own discovery.
func TestSharedTopology(t *testing.T) {
	requireMPI(t)
	own := runTopology(t, 2, "--topology", "off")
	for rank, rt := range own {
		if rt.madeBy != "hwlocprog" || rt.xmlFile != "-" {
			t.Errorf("--topology off: rank %d read a topology made by %s from %s, want its own discovery", rank, rt.madeBy, rt.xmlFile)
		}
	}
	want := own[0].counts

	shared := runTopology(t, 3)
	for rank, rt := range shared {
		if rt.madeBy != "gorun" || !strings.HasPrefix(rt.xmlFile, "/proc/self/fd/") {
			t.Errorf("rank %d: topology made by %s (HWLOC_XMLFILE %s), want gorun's, through an inherited descriptor", rank, rt.madeBy, rt.xmlFile)
		}
		if rt.thisSystem != "1" {
			t.Errorf("rank %d: the shared topology is not marked as this system (HWLOC_THISSYSTEM), so binding would not work", rank)
		}
		if rt.counts != want {
			t.Errorf("rank %d sees pus/pcidevs/osdevs %s in the shared topology, %s in its own", rank, rt.counts, want)
		}
	}

	// A user who steers hwloc keeps control.
	for rank, rt := range runTopology(t, 2, "-x", "HWLOC_FSROOT=/") {
		if rt.madeBy != "hwlocprog" || rt.xmlFile != "-" {
			t.Errorf("with HWLOC_FSROOT set: rank %d read a topology made by %s from %s, want its own discovery", rank, rt.madeBy, rt.xmlFile)
		}
	}
}

// TestTopologyOnlyForHwloc: a program that does not load libhwloc gets
// no hwloc variables.
func TestTopologyOnlyForHwloc(t *testing.T) {
	requireMPI(t)
	out, err := exec.Command(gorunBin, "-np", "1", "/usr/bin/env").CombinedOutput()
	if err != nil {
		t.Fatalf("gorun env: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "HWLOC_") {
		t.Errorf("a program without hwloc was given hwloc variables:\n%s", out)
	}
}
