package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// e2eDir holds the gorun that gorunBinary built; TestMain removes it.
var e2eDir string

// gorunBinary builds cmd/gorun once per test binary: the end-to-end tests
// run the real launcher with the real binary as every rank, as a user does.
var gorunBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gorun-bench-e2e-")
	if err != nil {
		return "", err
	}
	e2eDir = dir
	if err := launchertest.GoBuild(dir, "cmd/gorun"); err != nil {
		return "", err
	}
	return filepath.Join(dir, "gorun"), nil
})

type e2eResult struct {
	code           int
	stdout, stderr string
}

// gorun runs `gorun args...` with a deadline (a hang fails the test, it
// does not stall the suite).
func gorun(t *testing.T, args ...string) e2eResult {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and launches gorun")
	}
	bin, err := gorunBinary()
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range args {
		if a == "GORUN" {
			args[i] = bin
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(hangGuard):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("gorun %q did not finish within %v\nstdout:\n%s\nstderr:\n%s", args, hangGuard, &stdout, &stderr)
	}
	res := e2eResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return res
}

// Every operation on 1, 2 and 3 ranks, through `gorun -np N gorun bench`:
// exit 0, rank 0's table parses back with every row checked and correct,
// the JSON agrees with it, and no other rank printed a table.
func TestEndToEndEveryOp(t *testing.T) {
	sem := make(chan struct{}, 2) // the machine has 2 cores, shared
	for _, np := range []int{1, 2, 3} {
		for _, op := range Collectives {
			t.Run(fmt.Sprintf("%s/np%d", op, np), func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				js := filepath.Join(t.TempDir(), "r.json")
				args := []string{"-np", fmt.Sprint(np), "GORUN", "bench", op.String(),
					"-b", "8", "-e", "4K", "-f", "8", "-n", "3", "-w", "1", "--json", js}
				if op.Rooted() {
					args = append(args, "-r", fmt.Sprint(np-1))
				}
				res := gorun(t, args...)
				if res.code != 0 {
					t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
				}
				if n := strings.Count(res.stdout, "# gorun bench "); n != 1 {
					t.Errorf("%d tables printed, want rank 0's only:\n%s", n, res.stdout)
				}
				txt, err := Parse(strings.NewReader(res.stdout), ParseOptions{})
				if err != nil {
					t.Fatalf("%v\n%s", err, res.stdout)
				}
				jr, err := ReadFile(js, ParseOptions{})
				if err != nil {
					t.Fatal(err)
				}
				wantRows := 4 // 8, 64, 512, 4096
				if op == Barrier {
					wantRows = 1
				}
				if txt.Ranks != np || jr.Ranks != np || len(txt.Rows) != wantRows || len(jr.Rows) != wantRows ||
					len(jr.Hosts) != np || txt.Op != op.String() || jr.Wrong != 0 {
					t.Fatalf("report: ranks %d/%d rows %d/%d hosts %d op %s wrong %d\n%s",
						txt.Ranks, jr.Ranks, len(txt.Rows), len(jr.Rows), len(jr.Hosts), txt.Op, jr.Wrong, res.stdout)
				}
				wantKind := "self"
				if np > 1 {
					wantKind = "shm"
				}
				for _, h := range jr.Hosts {
					if h.PID == 0 || h.Host == "" || h.Transport != wantKind {
						t.Errorf("rank line %+v, want a pid, a host and transport %s", h, wantKind)
					}
				}
				for i, row := range jr.Rows {
					if row.Bytes != txt.Rows[i].Bytes || row.Count != txt.Rows[i].Count {
						t.Errorf("row %d: JSON %+v, text %+v", i, row, txt.Rows[i])
					}
					if op != Barrier && (row.OutOfPlace.Wrong != 0 || (row.InPlace != nil && row.InPlace.Wrong != 0)) {
						t.Errorf("row %d: wrong elements", i)
					}
				}
			})
		}
	}
}

func TestEndToEndTCPAndPlot(t *testing.T) {
	dir := t.TempDir()
	png1 := filepath.Join(dir, "p.png")
	res := gorun(t, "-np", "2", "GORUN", "bench", "allreduce", "-b", "1K", "-e", "64K", "-f", "4",
		"-n", "3", "-w", "1", "--transport", "tcp", "--plot", png1, "--plot-width", "640", "--plot-height", "320",
		"--compare", "nccl=testdata/nccl-tests-all_reduce_perf.txt", "testdata/osu_allreduce.txt")
	if res.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stdout, "transport tcp") || strings.Contains(res.stdout, "transport shm") {
		t.Errorf("--transport tcp not in effect:\n%s", res.stdout)
	}
	f, err := os.Open(png1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 640 || b.Dy() != 320 {
		t.Errorf("plot %v, want 640x320", b)
	}
}

func TestEndToEndUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "frobnicate"}, "unknown operation"},
		{[]string{"bench", "allreduce", "-b", "1Q"}, "size"},
		{[]string{"bench", "allreduce", "--compare", "/nonexistent.txt"}, "nonexistent"},
		{[]string{"bench", "broadcast", "-r", "3"}, "root"},
	} {
		res := gorun(t, c.args...)
		wantCode := 2
		if c.want == "nonexistent" {
			wantCode = 1
		}
		if res.code != wantCode || !strings.Contains(res.stderr, c.want) {
			t.Errorf("gorun %q: exit %d, stderr %q; want exit %d mentioning %q", c.args, res.code, res.stderr, wantCode, c.want)
		}
	}
}

// One wrong element on one rank makes every rank exit non-zero, gorun
// report it, and rank 0's table say FAILED.
func TestEndToEndWrongResultFailsJob(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(corruptRankEnv, "1")
	res := gorun(t, "-np", "2", self)
	if res.code != 1 || !strings.Contains(res.stdout, "# Out of bounds values : 1 FAILED") {
		t.Errorf("exit %d, want 1 with a FAILED footer\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
}

// Two ranks on two hosts (network namespaces with their own addresses):
// each advertises its data-plane endpoint under its host name, so the ranks
// reach each other over TCP between hosts, and `--transport auto` reports
// tcp. The ranks are started by hand with gorun's variables, as a remote
// agent would start them.
func TestEndToEndTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts namespace hosts")
	}
	bin, err := gorunBinary()
	if err != nil {
		t.Fatal(err)
	}
	h := testhosts.RequireNetns(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	outs := make([]bytes.Buffer, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, host := range h.Hosts {
		cmd := h.ExecCommand(ctx, host, bin, "bench", "allreduce", "-b", "8", "-e", "1M", "-f", "16", "-n", "3", "-w", "1")
		cmd.Env = append(os.Environ(),
			"GORUN_RANK="+fmt.Sprint(r), "GORUN_WORLD_SIZE=2", "GORUN_LOCAL_RANK=0",
			"GORUN_JOB_ID=bench-e2e-"+h.Set, "GORUN_RDZV_ENDPOINT="+h.Addrs[0]+":29400",
			"GORUN_SECRET="+hex.EncodeToString(secret), "GORUN_HOST="+host)
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		cmd.WaitDelay = 5 * time.Second
		wg.Go(func() { errs[r] = cmd.Run() })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, &outs[r])
		}
	}
	rep, err := Parse(&outs[0], ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Hosts) != 2 || rep.Wrong != 0 || len(rep.Rows) != 5 { // 8, 128, 2K, 32K, 512K
		t.Fatalf("report %+v", rep)
	}
	for r, hi := range rep.Hosts {
		if hi.Host != h.Hosts[r] || hi.Transport != "tcp" {
			t.Errorf("rank %d: %+v, want host %s over tcp", r, hi, h.Hosts[r])
		}
	}
}
