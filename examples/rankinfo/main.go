// Command rankinfo prints, on one line, the rank environment gorun gave it:
// the quickest way to see what a launched program receives.
//
//	gorun -np 4 bin/rankinfo
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/gorun-hpc/gorun/rankenv"
)

func main() {
	host, _ := os.Hostname()
	vars := []string{
		rankenv.Rank, rankenv.WorldSize, rankenv.LocalRank, rankenv.LocalWorldSize,
		rankenv.NodeRank, rankenv.MasterAddr, rankenv.MasterPort,
		rankenv.PMIRank, rankenv.PMIFD, rankenv.CUDAVisibleDevices,
		rankenv.JobID, rankenv.RdzvEndpoint,
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rank %s/%s on %s pid %d:", os.Getenv(rankenv.Rank), os.Getenv(rankenv.WorldSize), host, os.Getpid())
	for _, v := range vars {
		if val, ok := os.LookupEnv(v); ok {
			fmt.Fprintf(&b, " %s=%s", v, val)
		}
	}
	if _, ok := os.LookupEnv(rankenv.Secret); ok {
		// Never print the secret itself: logs get shared.
		fmt.Fprintf(&b, " %s=(set)", rankenv.Secret)
	}
	fmt.Println(b.String())
}
