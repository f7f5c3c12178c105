package supervisor

import (
	"strings"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/rankenv"
)

// visibleDevice gives a rank assigned GPU index i the device that index
// stands for on its host. The plan writes CUDA_VISIBLE_DEVICES=i, which is
// right when the supervisor sees every device; when its own environment
// already narrows them (SLURM's gres sets CUDA_VISIBLE_DEVICES=2,3 for a
// step, and so does a user), GPU counting saw only those, index i means
// the i-th of that list, and CUDA reads the variable as device ids, so the
// rank gets the list's i-th entry ("3" for i=1, not "1").
func visibleDevice(env []string, i int, parent string) []string {
	parent = strings.TrimSpace(parent)
	if parent == "" {
		return env
	}
	ids := strings.Split(parent, ",")
	if i < 0 || i >= len(ids) {
		return env
	}
	return plan.MergeEnv(env, []string{rankenv.CUDAVisibleDevices + "=" + strings.TrimSpace(ids[i])})
}
