package plan

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/rankenv"
)

// RankEnv builds the variables of rank r of p in a fixed order: torch, PMI
// (when served), CUDA, gorun, then c's exports (last, so they win). New
// sets every RankSpec.Env with it; a multi-host launch calls it again for a
// host that came up after the plan was made, once c.Interfaces knows that
// host's interface.
func (p *Plan) RankEnv(r RankSpec, c Config) []string {
	itoa := strconv.Itoa
	env := []string{
		rankenv.Rank + "=" + itoa(r.Rank),
		rankenv.WorldSize + "=" + itoa(p.WorldSize),
		rankenv.LocalRank + "=" + itoa(r.LocalRank),
		rankenv.LocalWorldSize + "=" + itoa(r.LocalSize),
		rankenv.NodeRank + "=" + itoa(r.NodeRank),
		rankenv.GroupRank + "=" + itoa(r.NodeRank),
		rankenv.MasterAddr + "=" + p.MasterAddr,
		rankenv.MasterPort + "=" + itoa(p.MasterPort),
	}
	if p.PMI {
		// PMI_FD or PMI_PORT is added by the supervisor that serves the
		// rank: only it knows the descriptor or port.
		env = append(env, rankenv.PMIRank+"="+itoa(r.Rank), rankenv.PMISize+"="+itoa(p.WorldSize))
	}
	if r.GPU >= 0 {
		env = append(env, rankenv.CUDAVisibleDevices+"="+itoa(r.GPU))
	}
	env = append(env,
		rankenv.JobID+"="+c.JobID,
		rankenv.GorunRank+"="+itoa(r.Rank),
		rankenv.GorunWorldSize+"="+itoa(p.WorldSize),
		rankenv.GorunLocalRank+"="+itoa(r.LocalRank),
		rankenv.GorunLocalSize+"="+itoa(r.LocalSize),
		rankenv.GorunNodeRank+"="+itoa(r.NodeRank),
		rankenv.GorunHost+"="+r.Host,
		rankenv.Secret+"="+c.Secret,
		rankenv.RdzvEndpoint+"="+p.RdzvEndpoint,
	)
	if iface := c.Interfaces[r.Host]; iface != "" {
		env = append(env, rankenv.NCCLSocketIfname+"="+iface, rankenv.GlooSocketIfname+"="+iface)
	}
	return MergeEnv(env, c.Export)
}

// perRankNames are the variables gorun defines for every rank from its plan
// (RankEnv), with what each says: the rank's identity and the job's. Not
// among them are the ones that name where to meet — MASTER_ADDR,
// MASTER_PORT, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME — which are the same
// on every rank and which a user may know better (torch scripts often fix
// MASTER_PORT). PMI_FD, PMI_PORT and PMI_ID are set by the supervisor that
// serves PMI.
var perRankNames = map[string]string{
	rankenv.Rank: "the rank", rankenv.WorldSize: "the number of ranks",
	rankenv.LocalRank: "the rank on its host", rankenv.LocalWorldSize: "the number of ranks on its host",
	rankenv.NodeRank: "its host's index", rankenv.GroupRank: "its host's index",
	rankenv.PMIRank: "the rank", rankenv.PMISize: "the number of ranks",
	rankenv.PMIFD: "the rank's PMI socket", rankenv.PMIPort: "the PMI server", rankenv.PMIID: "the rank's PMI identity",
	rankenv.JobID: "the job", rankenv.GorunRank: "the rank", rankenv.GorunWorldSize: "the number of ranks",
	rankenv.GorunLocalRank: "the rank on its host", rankenv.GorunLocalSize: "the number of ranks on its host",
	rankenv.GorunNodeRank: "its host's index", rankenv.GorunHost: "its host",
	rankenv.Secret: "the job secret", rankenv.RdzvEndpoint: "the rendezvous seed",
}

// checkExportName refuses exporting a variable gorun defines per rank;
// CUDA_VISIBLE_DEVICES only when gorun assigns GPUs (gpus), since without
// that a user's choice of devices is the only one.
func checkExportName(name string, gpus bool) error {
	what, ok := perRankNames[name]
	hint := ""
	if !ok && gpus && name == rankenv.CUDAVisibleDevices {
		what, ok = "the rank's GPU", true
		hint = " (drop --gpus-per-host to choose the devices yourself)"
	}
	if ok {
		return fmt.Errorf("launcher: -x %s: gorun sets %s to %s on every rank; it cannot be exported%s", name, name, what, hint)
	}
	return nil
}

// ResolveExports turns -x values into NAME=VALUE pairs: NAME=VALUE is kept,
// a bare NAME takes its value from lookup (the launcher's environment) and is
// an error when unset, since silently exporting nothing hides typos. A name
// gorun defines for each rank (RANK, WORLD_SIZE, ...) is refused: exported,
// it would give every rank the same value and silently break the job.
func ResolveExports(specs []string, lookup func(string) (string, bool)) ([]string, error) {
	out := make([]string, 0, len(specs))
	for _, s := range specs {
		name, value, hasValue := strings.Cut(s, "=")
		if name == "" || strings.ContainsAny(name, " \t\n") {
			return nil, fmt.Errorf("launcher: -x %q: expected NAME or NAME=VALUE", s)
		}
		if err := checkExportName(name, false); err != nil {
			return nil, err
		}
		if !hasValue {
			v, ok := lookup(name)
			if !ok {
				return nil, fmt.Errorf("launcher: -x %s: variable is not set in gorun's environment", name)
			}
			value = v
		}
		out = append(out, name+"="+value)
	}
	return out, nil
}

// MergeEnv concatenates environment lists where a later NAME=VALUE replaces
// an earlier one. The launcher's supervisor starts ranks with os.StartProcess, which
// passes duplicates through, and C's getenv (like Go's) returns the first:
// without this, a RANK inherited from gorun's own environment would shadow
// the plan's.
func MergeEnv(lists ...[]string) []string {
	last := map[string]int{}
	n := 0
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			last[k] = n
			n++
		}
	}
	out := make([]string, 0, len(last))
	i := 0
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if last[k] == i {
				out = append(out, kv)
			}
			i++
		}
	}
	return out
}
