package rankenv

import "strings"

// WithoutOtherLaunchers returns env (a base environment: gorun's own, or a
// host agent's) without the variables by which another launcher described
// its launch: gorun run inside an mpiexec or mpirun rank, say. Passed on,
// they would point the ranks at that launcher's PMI or PMIx server and
// claim a world that is not theirs. User settings of those libraries
// (OMPI_MCA_*, PMIX_MCA_*) stay. The launcher applies -x exports after
// this, so they still win. env is not modified.
func WithoutOtherLaunchers(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == PMIRank, k == PMISize, k == PMIFD, k == PMIPort,
			k == PMIID, k == "PMI_SPAWNED", k == "PMI_JOBID",
			strings.HasPrefix(k, "OMPI_COMM_WORLD_"),
			strings.HasPrefix(k, "PMIX_") && !strings.HasPrefix(k, "PMIX_MCA_"):
			continue
		}
		out = append(out, kv)
	}
	return out
}
