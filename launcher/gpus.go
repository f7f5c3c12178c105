package launcher

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"time"
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
