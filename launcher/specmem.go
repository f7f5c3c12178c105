package launcher

import "github.com/gorun-hpc/gorun/launcher/wire"

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
