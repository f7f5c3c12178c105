package launcher

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/plan"
)

// TestPMIJobMapsRanksToTheirHosts: the process mapping handed to MPI
// places every rank on the node the plan put it on. MPI decides from it
// which ranks share memory, so a mapping that put every rank on one node
// would send ranks on different hosts to each other's shared memory. The
// multi-host MPI tests see that too, but only as root; this needs nothing.
func TestPMIJobMapsRanksToTheirHosts(t *testing.T) {
	for _, hosts := range [][]Host{
		{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}},
		{{Name: "a", Slots: 3}, {Name: "b", Slots: 3}, {Name: "c", Slots: 1}},
		{{Name: "a", Slots: 1}, {Name: "b", Slots: 2}, {Name: "c", Slots: 1}},
		{{Name: "a", Slots: 4}},
	} {
		np := 0
		for _, h := range hosts {
			np += h.Slots
		}
		plan, err := plan.New(plan.Config{
			NP: np, Hosts: hosts, JobID: "j", Secret: "s",
			MasterAddr: "127.0.0.1", MasterPort: 1, RdzvPort: 2,
		})
		if err != nil {
			t.Fatal(err)
		}
		job, err := pmiJobFor(plan, PMIFD)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := decodeVectorMapping(job.Mapping)
		if err != nil {
			t.Fatalf("%v: %v", hosts, err)
		}
		if len(nodes) != plan.WorldSize || job.Size != plan.WorldSize {
			t.Fatalf("%v: mapping %q covers %d ranks, size %d, want %d", hosts, job.Mapping, len(nodes), job.Size, plan.WorldSize)
		}
		for r, rs := range plan.Ranks {
			if nodes[r] != rs.NodeRank {
				t.Errorf("%v: mapping %q puts rank %d on node %d, the plan on node %d (%s)",
					hosts, job.Mapping, r, nodes[r], rs.NodeRank, rs.Host)
			}
		}
	}
}

// decodeVectorMapping reads MPICH's (vector,(first,nodes,ranks),...) the
// way MPICH does: blocks in order, each giving ranks consecutive ranks to
// each of nodes consecutive node ids starting at first. It returns the
// node id of every rank.
func decodeVectorMapping(s string) ([]int, error) {
	m := regexp.MustCompile(`^\(vector((?:,\(\d+,\d+,\d+\))+)\)$`).FindStringSubmatch(s)
	if m == nil {
		return nil, fmt.Errorf("not a vector mapping: %q", s)
	}
	var nodes []int
	for _, b := range regexp.MustCompile(`\((\d+),(\d+),(\d+)\)`).FindAllStringSubmatch(m[1], -1) {
		first, _ := strconv.Atoi(b[1])
		count, _ := strconv.Atoi(b[2])
		ranks, _ := strconv.Atoi(b[3])
		for n := first; n < first+count; n++ {
			for range ranks {
				nodes = append(nodes, n)
			}
		}
	}
	return nodes, nil
}
