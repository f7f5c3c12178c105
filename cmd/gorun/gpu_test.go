package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/nccl/nccltest"
)

// The GPU path end to end with the real binary, built as `make build` does
// but with cgo off: it needs no CUDA or NCCL to build or start; on a host
// without them `gorun bench --device cuda` fails at once saying what is
// missing; with the stand-in NCCL and driver it runs the nccl-tests table
// with the device-side check, and that check catches a broken NCCL.
func TestGPUPathEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gorun and starts processes")
	}
	dir := t.TempDir()
	p := &gpuPath{dir: dir, bin: filepath.Join(dir, "gorun"), empty: t.TempDir()}
	build := exec.Command("go", "build", "-o", p.bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	t.Run("binary needs no CUDA", p.needsNoCUDA)
	t.Run("-tags nogpu: a static binary that says it has no GPU side", p.noGPUBuild)
	t.Run("no GPU: fails at once naming what is missing", p.noGPUFailsAtOnce)
	libs, err := nccltest.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p.libsDir = libs.Dir
	p.standin = []string{"LD_LIBRARY_PATH=" + libs.Dir, "STANDIN_CUDA_DEVICES=2"}
	t.Run("stand-in NCCL: the table, checked on the device", p.standinTable)
	t.Run("launcher GPU assignment and nccl agree", p.assignment)
	t.Run("GPUs narrowed by the launcher's environment", p.narrowed)
	t.Run("doctor's GPUS column is what the driver shows nccl", p.doctorGPUs)
	t.Run("stand-in NCCL that corrupts: the device check catches it", p.corruptCaught)
}

// gpuPath is TestGPUPathEndToEnd's binary and the libraries it runs with.
type gpuPath struct {
	dir, bin string   // the built gorun, in dir
	empty    string   // a directory with no library: no driver, no NCCL
	libsDir  string   // the stand-in NCCL and driver
	standin  []string // the environment that loads them, with 2 devices
}

// run runs the binary with env added and returns its exit code, stdout
// and stderr; the test fails if it runs past timeout.
func (p *gpuPath) run(t *testing.T, timeout time.Duration, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(p.bin, args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // owned: read below on every path
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("gorun %v still running after %v:\n%s%s", args, timeout, stdout.String(), stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// needsNoCUDA: the binary needs only the C library's loader at start.
func (p *gpuPath) needsNoCUDA(t *testing.T) {
	f, err := elf.Open(p.bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	// purego's dlopen makes the binary use the C library's loader
	// (notes/nccl-binding.md); nothing else may be needed at start.
	allowed := []string{"libc.so.6", "libdl.so.2", "libpthread.so.0"}
	for _, l := range libs {
		if !slices.Contains(allowed, l) {
			t.Errorf("gorun needs %s at start; only %v are allowed", l, allowed)
		}
	}
	t.Logf("NEEDED: %v", libs)
}

// noGPUBuild: -tags nogpu builds a static binary that says it has no GPU
// side.
func (p *gpuPath) noGPUBuild(t *testing.T) {
	static := filepath.Join(p.dir, "gorun-nogpu")
	build := exec.Command("go", "build", "-tags", "nogpu", "-o", static, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nogpu: %v\n%s", err, out)
	}
	f, err := elf.Open(static)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Section(".interp") != nil || f.Section(".dynamic") != nil {
		libs, _ := f.ImportedLibraries()
		t.Errorf("the nogpu binary is dynamically linked (needs %v)", libs)
	}
	out, err := exec.Command(static, "bench", "allreduce", "--device", "cuda").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "built with -tags nogpu, without GPU support") {
		t.Errorf("--device cuda on a nogpu build: %v, %q", err, out)
	}
}

// noGPUFailsAtOnce: with no driver, --device cuda fails at once naming
// what is missing.
func (p *gpuPath) noGPUFailsAtOnce(t *testing.T) {
	start := time.Now()
	code, stdout, stderr := p.run(t, 20*time.Second, []string{"LD_LIBRARY_PATH=" + p.empty},
		"-np", "2", p.bin, "bench", "allreduce", "--device", "cuda")
	took := time.Since(start)
	if code == 0 {
		t.Fatalf("exit 0:\n%s%s", stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	want := "gorun bench: bench: --device cuda: nccl: cannot load libcuda.so.1 (the NVIDIA driver's CUDA library): libcuda.so.1: cannot open shared object file"
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, want) {
			n++
		}
	}
	if n == 0 {
		t.Errorf("no rank said %q:\n%s", want, stderr)
	}
	if stdout != "" {
		t.Errorf("a table was printed:\n%s", stdout)
	}
	// "At once": no rendezvous, no timeout; generous for a shared machine.
	if took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	t.Logf("exit %d after %v:\n%s", code, took, stderr)
}

// standinTable: with the stand-in NCCL every collective prints its
// table, checked on the device.
func (p *gpuPath) standinTable(t *testing.T) {
	for _, op := range []string{"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv"} {
		code, stdout, stderr := p.run(t, 60*time.Second, p.standin,
			"-np", "2", p.bin, "bench", op, "--device", "cuda", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
			"-d", "bfloat16", "--json", filepath.Join(p.dir, op+".json"))
		if code != 0 {
			t.Fatalf("%s: exit %d:\n%s%s", op, code, stdout, stderr)
		}
		if c := strings.Count(stdout, "transport nccl"); c != 2 {
			t.Errorf("%s: %d ranks report transport nccl:\n%s", op, c, stdout)
		}
		rows := regexp.MustCompile(`(?m)^\s+\d+\s+\d+\s+bfloat16.*$`).FindAllString(stdout, -1)
		if len(rows) != 5 {
			t.Errorf("%s: %d rows, want 5 (8 B to 64 KiB by 8):\n%s", op, len(rows), stdout)
		}
		for _, r := range rows {
			f := strings.Fields(r)
			// #wrong is the 9th and 13th field; sendrecv has no
			// in-place form and prints N/A there.
			if f[8] != "0" || (f[12] != "0" && f[12] != "N/A") {
				t.Errorf("%s: wrong elements: %q", op, r)
			}
		}
	}
}

// assignment: the launcher's GPU assignment and nccl agree.
func (p *gpuPath) assignment(t *testing.T) {
	// Two GPUs per host, four ranks: local rank l runs on physical
	// GPU l mod 2, whether the launcher narrows CUDA_VISIBLE_DEVICES
	// (--gpus-per-host, or by default the driver's count, which the
	// launcher now reads through nccl/; each rank then sees one
	// device, ordinal 0) or every rank sees both (--gpus-per-host 0)
	// and nccl picks LOCAL_RANK mod 2.
	for _, tc := range []struct {
		flags   []string
		ordinal func(r int) int
	}{
		{[]string{"--gpus-per-host", "2"}, func(int) int { return 0 }},
		{nil, func(int) int { return 0 }},
		{[]string{"--gpus-per-host", "0"}, func(r int) int { return r % 2 }},
	} {
		args := append(append([]string{"-np", "4"}, tc.flags...), p.bin, "bench", "allreduce", "--device", "cuda", "-b", "8", "-e", "8")
		code, stdout, stderr := p.run(t, 60*time.Second, p.standin, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d:\n%s%s", tc.flags, code, stdout, stderr)
		}
		for r := range 4 {
			want := regexp.MustCompile(fmt.Sprintf(`(?m)^#  Rank  %d Pid .* device %d \[gorun stand-in device %d\] transport nccl$`, r, tc.ordinal(r), r%2))
			if !want.MatchString(stdout) {
				t.Errorf("%v: rank %d not on physical GPU %d:\n%s", tc.flags, r, r%2, stdout)
			}
		}
	}
}

// narrowed: GPUs narrowed by the launcher's environment.
func (p *gpuPath) narrowed(t *testing.T) {
	// Four devices, of which the launcher's CUDA_VISIBLE_DEVICES (as
	// SLURM's gres sets it) leaves 2 and 3: the driver counts 2, so
	// local rank l gets index l mod 2, and that index must become
	// device 2 or 3, not 0 or 1.
	env := append(slices.Clone(p.standin), "STANDIN_CUDA_DEVICES=4", "CUDA_VISIBLE_DEVICES=2,3")
	code, stdout, stderr := p.run(t, 60*time.Second, env, "-np", "4", p.bin, "bench", "allreduce", "--device", "cuda", "-b", "8", "-e", "8")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, stdout, stderr)
	}
	for r := range 4 {
		want := regexp.MustCompile(fmt.Sprintf(`(?m)^#  Rank  %d Pid .* device 0 \[gorun stand-in device %d\] transport nccl$`, r, 2+r%2))
		if !want.MatchString(stdout) {
			t.Errorf("rank %d not on physical GPU %d:\n%s", r, 2+r%2, stdout)
		}
	}
}

// doctorGPUs: doctor's GPUS column is what the driver shows nccl.
func (p *gpuPath) doctorGPUs(t *testing.T) {
	// The stand-in driver with N devices, narrowed or not by
	// CUDA_VISIBLE_DEVICES as the real driver narrows them.
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"STANDIN_CUDA_DEVICES=3"}, "3"},
		{[]string{"STANDIN_CUDA_DEVICES=3", "CUDA_VISIBLE_DEVICES=2"}, "1"},
		{[]string{"STANDIN_CUDA_DEVICES=0"}, "0"},
		{[]string{"LD_LIBRARY_PATH=" + p.empty}, "0"}, // no driver at all
	} {
		env := append([]string{"LD_LIBRARY_PATH=" + p.libsDir}, tc.env...)
		code, stdout, stderr := p.run(t, 60*time.Second, env, "doctor", "-H", "localhost", "--launch-agent", "env")
		if code != 0 {
			t.Fatalf("%v: doctor exit %d:\n%s%s", tc.env, code, stdout, stderr)
		}
		m := regexp.MustCompile(`(?m)^localhost\s+ok\s+\S+\s+\S+ \S+\s+ok\s+\S+\s+(\d+)\s+ok$`).FindStringSubmatch(stdout)
		if m == nil || m[1] != tc.want {
			t.Errorf("%v: GPUS column %v, want %s:\n%s", tc.env, m, tc.want, stdout)
		}
	}
}

// corruptCaught: a stand-in NCCL that corrupts is caught by the device
// check.
func (p *gpuPath) corruptCaught(t *testing.T) {
	code, stdout, stderr := p.run(t, 60*time.Second, append(p.standin, "STANDIN_NCCL_CORRUPT=1"),
		"-np", "2", p.bin, "bench", "allreduce", "--device", "cuda", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1")
	if code == 0 {
		t.Fatalf("exit 0 with a corrupting NCCL:\n%s", stdout)
	}
	rows := regexp.MustCompile(`(?m)^\s+\d+\s+\d+\s+float.*$`).FindAllString(stdout, -1)
	if len(rows) != 3 {
		t.Fatalf("%d rows:\n%s%s", len(rows), stdout, stderr)
	}
	for _, r := range rows {
		// One corrupted element per rank and call: 2 per placement.
		if f := strings.Fields(r); f[8] != "2" || f[12] != "2" {
			t.Errorf("row %q: want #wrong 2 for both placements", r)
		}
	}
}
