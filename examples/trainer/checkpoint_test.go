package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckpointResume: a run stopped after 10 steps with a checkpoint
// every 4 leaves the state of step 8; a second run from the same directory
// resumes there (its first loss is step 9's) and ends with the losses and
// parameters of an uninterrupted run, bit for bit — also when the second
// run has another rank count or mode, since the checkpoint holds the whole
// state (what a job shrunk by --min-np needs). The same rank count and
// mode on both sides is TestRealKillResume's.
func TestCheckpointResume(t *testing.T) {
	// 10 steps with a checkpoint every 4, then a resume after step 8 to
	// step 12: longer than numSteps, which the other comparisons use.
	const steps = 12
	ro := smallOptions()
	ro.steps = steps
	ref := reference(t, ro)
	for _, tc := range []struct {
		name         string
		n1, n2       int
		mode1, mode2 string
	}{
		{"sharded 4 → dp 2", 4, 2, "sharded", "dp"},
		{"dp 2 → sharded 4", 2, 4, "dp", "sharded"},
		{"hsdp 4 → sharded 2", 4, 2, "hsdp", "sharded"},
		{"dp 2 → hsdp 4", 2, 4, "dp", "hsdp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := smallOptions()
			o.checkpoint, o.checkpointEvery, o.steps, o.mode = dir, 4, 10, tc.mode1
			first := runInProcess(t, o, tc.n1)
			if len(first.losses) != 10 || !sameLosses(first.losses, ref.Losses[:10]) {
				t.Fatalf("the first run's losses differ from the reference")
			}
			o.steps, o.mode = steps, tc.mode2
			second := runInProcess(t, o, tc.n2)
			if len(second.losses) != steps-8 {
				t.Fatalf("the second run trained %d steps, want %d (resumed after step 8)", len(second.losses), steps-8)
			}
			checkAgainst(t, ref, append(slices8(ref.Losses), second.losses...), second.params)
			// Only the checkpoint: every temporary file was renamed.
			ents, _ := os.ReadDir(dir)
			if len(ents) != 1 || ents[0].Name() != checkpointFile {
				t.Errorf("checkpoint dir holds %v", ents)
			}
		})
	}
}

func slices8(l []float32) []float32 { return append([]float32(nil), l[:8]...) }

// A checkpoint of another model, or a damaged one, is refused by every rank
// with the file named, instead of being misread.
func TestCheckpointRefused(t *testing.T) {
	dir := t.TempDir()
	o := smallOptions()
	o.checkpoint, o.checkpointEvery, o.steps = dir, 2, 2
	runInProcess(t, o, 2)
	name := filepath.Join(dir, checkpointFile)
	good, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func() ([]byte, options)
		want string
	}{
		{"damaged", func() ([]byte, options) {
			b := append([]byte(nil), good...)
			b[len(b)/2] ^= 1
			return b, o
		}, "damaged"},
		{"truncated", func() ([]byte, options) { return good[:len(good)-9], o }, "damaged"},
		{"other batch", func() ([]byte, options) { p := o; p.batch = 16; return good, p }, "another model"},
		{"not one", func() ([]byte, options) { return []byte("hello"), o }, "not a trainer checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, p := tc.edit()
			if err := os.WriteFile(name, b, 0o644); err != nil {
				t.Fatal(err)
			}
			p.steps = 4
			_, errs := runRanks(t, 2, func(int) options { return p })
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "checkpoint") {
					t.Errorf("rank %d: %v, want the checkpoint refused", r, err)
				}
			}
			if errs[0] == nil || !strings.Contains(errs[0].Error(), tc.want) || !strings.Contains(errs[0].Error(), name) {
				t.Errorf("rank 0: %v, want %q and the file named", errs[0], tc.want)
			}
		})
	}
}
