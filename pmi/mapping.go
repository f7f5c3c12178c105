package pmi

import (
	"fmt"
	"strconv"
	"strings"
)

// ProcessMapping returns the PMI_process_mapping value for a placement in
// which node i runs perNode[i] consecutive ranks, node 0 first (gorun's
// block placement).
//
// The format is MPICH's "vector" of blocks, (vector,(first,nodes,ranks),...):
// each block says that, starting at node id first, nodes consecutive nodes
// each run ranks consecutive ranks. Neighbouring nodes with equal counts
// share one block, as Hydra writes it: 2 nodes × 2 ranks is
// (vector,(0,2,2)); counts 3,3,1 are (vector,(0,2,3),(2,1,1)). MPICH builds
// its node map from this, and so decides which ranks reach each other
// through shared memory. A node with no ranks is an error: the plan never
// lists one, and a zero block would mean a different placement.
func ProcessMapping(perNode []int) (string, error) {
	if len(perNode) == 0 {
		return "", fmt.Errorf("pmi: process mapping of no nodes")
	}
	var b strings.Builder
	b.WriteString("(vector")
	for i := 0; i < len(perNode); {
		n := perNode[i]
		if n <= 0 {
			return "", fmt.Errorf("pmi: process mapping: node %d has %d ranks", i, n)
		}
		j := i + 1
		for j < len(perNode) && perNode[j] == n {
			j++
		}
		b.WriteString(",(" + strconv.Itoa(i) + "," + strconv.Itoa(j-i) + "," + strconv.Itoa(n) + ")")
		i = j
	}
	b.WriteString(")")
	return b.String(), nil
}
