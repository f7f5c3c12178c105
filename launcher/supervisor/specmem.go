package supervisor

import (
	"runtime/debug"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// shareRankStrings makes the ranks' equal strings one string: decoded from
// the spec, every rank's environment and arguments are copies of their
// own, though all but a few variables (RANK, LOCAL_RANK, ...) are the
// same for every rank. The supervisor keeps the spec for the job's life,
// so at thousands of ranks the copies were kilobytes per rank (the
// environment's size, per rank); shared, a rank costs its slice headers
// and the variables that are its own.
func shareRankStrings(ranks []wire.SupervisorRank) {
	seen := map[string]string{}
	share := func(ss []string) {
		for i, s := range ss {
			if v, ok := seen[s]; ok {
				ss[i] = v
			} else {
				seen[s] = s
			}
		}
	}
	for i := range ranks {
		share(ranks[i].Env)
		share(ranks[i].Argv)
		if v, ok := seen[ranks[i].Path]; ok {
			ranks[i].Path = v
		} else {
			seen[ranks[i].Path] = ranks[i].Path
		}
	}
}

// ReturnStartupMemory hands the heap freed after a job's start back to the
// system. Starting thousands of ranks makes transient garbage in
// proportion to ranks × environment size (the spec encoded once and
// decoded once, every rank's merged environment, argv and attributes
// built for its exec); the runtime would return those pages only slowly,
// so for the job's life they would count as memory the launcher holds
// per rank. One forced collection, once per job start, costs
// milliseconds.
func ReturnStartupMemory() { debug.FreeOSMemory() }
