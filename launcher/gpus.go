package launcher

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/rankenv"
)

// GPUProbe counts this machine's GPUs. The default asks nvidia-smi;
// cmd/gorun replaces it, in builds with the GPU side, by the CUDA driver
// through nccl/ (the devices a rank will see, CUDA_VISIBLE_DEVICES
// applied), so that the default --gpus-per-host, doctor's GPUS column and
// what nccl opens are one count. It returns 0 where there is no GPU: no GPU
// is a normal machine, not an error.
var GPUProbe = nvidiaSMIGPUs

// DetectGPUs is GPUProbe: the default GPUs per host, and doctor's column.
func DetectGPUs(ctx context.Context) int { return GPUProbe(ctx) }

// nvidiaSMIGPUs counts `nvidia-smi -L` lines ("GPU n: ..."), 0 when
// nvidia-smi is absent or fails. The probe is bounded to a few seconds
// since a wedged driver can make nvidia-smi hang.
func nvidiaSMIGPUs(ctx context.Context) int {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-L").Output()
	if err != nil {
		return 0
	}
	return countGPULines(out)
}

func countGPULines(out []byte) int {
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(strings.TrimSpace(sc.Text()), "GPU ") {
			n++
		}
	}
	return n
}

// gpuOf is the rank's assigned GPU for the supervisor, nil for none.
func gpuOf(r RankSpec) *int {
	if r.GPU < 0 {
		return nil
	}
	g := r.GPU
	return &g
}

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
	return mergeEnv(env, []string{rankenv.CUDAVisibleDevices + "=" + strings.TrimSpace(ids[i])})
}
