package launcher

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"time"
)

// DetectGPUs counts this machine's GPUs with `nvidia-smi -L` (one "GPU n:"
// line each) and returns 0 when nvidia-smi is absent or fails: no GPU is a
// normal machine, not an error. The probe is bounded to a few seconds since
// a wedged driver can make nvidia-smi hang.
func DetectGPUs(ctx context.Context) int {
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
