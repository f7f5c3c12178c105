package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// TestUnderGorun runs the expert-parallel layer as a user does, gorun
// -np N bin/moe, on 2 and 4 ranks, whole and chunked: every rank checks
// every token's combined output against the expert computed locally (the
// binary exits 1 on any difference), and the all_to_allv splits rank 0
// reports are uneven and account for every token.
func TestUnderGorun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := launchertest.Build(t, "cmd/gorun", "examples/moe")
	const tokens = 96
	split := regexp.MustCompile(`tokens per expert \[([0-9 ]+)\]`)
	for _, tc := range []struct{ np, chunks int }{{2, 1}, {2, 3}, {4, 1}, {4, 2}} {
		t.Run(fmt.Sprintf("np%d/chunks%d", tc.np, tc.chunks), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(dir, "gorun"), "-np", strconv.Itoa(tc.np), filepath.Join(dir, "moe"),
				"--tokens", strconv.Itoa(tokens), "--dim", "8", "--chunks", strconv.Itoa(tc.chunks), "--steps", "3")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("gorun: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
			}
			if !strings.Contains(string(out), "3 steps verified bit for bit") {
				t.Fatalf("no verification line:\n%s", out)
			}
			m := split.FindStringSubmatch(string(out))
			if m == nil {
				t.Fatalf("no split line:\n%s", out)
			}
			sum, distinct := 0, map[string]bool{}
			for _, f := range strings.Fields(m[1]) {
				v, _ := strconv.Atoi(f)
				sum += v
				distinct[f] = true
			}
			if fs := strings.Fields(m[1]); len(fs) != tc.np || sum != tc.np*tokens || len(distinct) < 2 {
				t.Fatalf("tokens per expert %v: want %d experts, %d tokens in all, uneven", fs, tc.np, tc.np*tokens)
			}
		})
	}
}

// TestFlags: bad sizes are refused with the flag named.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		o    options
		want string
	}{
		{options{tokens: 0, dim: 4, chunks: 1, steps: 1}, "--tokens 0"},
		{options{tokens: 4, dim: 4, chunks: 5, steps: 1}, "--chunks 5"},
		{options{tokens: 4, dim: 4, chunks: 0, steps: 1}, "--chunks 0"},
		{options{tokens: 4, dim: 4, chunks: 1, steps: 0}, "--steps 0"},
	} {
		err := tc.o.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.o, err, tc.want)
		}
	}
	if err := (options{tokens: 4, dim: 4, chunks: 4, steps: 1}).validate(); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
