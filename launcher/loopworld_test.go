package launcher

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// scriptedWorld is a worldHooks with one injection and one checkpoint cue
// of its own, recording what the job loop tells it.
type scriptedWorld struct {
	inj      injection
	injAt    time.Duration // after the world's start
	cueAt    time.Duration
	start    time.Time // the world's start, as its clock reads it
	injSent  bool
	calls    []string
	failures []failure
}

var _ worldHooks = (*scriptedWorld)(nil)

func (w *scriptedWorld) next() (injection, bool) { return w.inj, !w.injSent }
func (w *scriptedWorld) due(injection) time.Duration {
	return max(0, w.injAt-time.Since(w.start))
}
func (w *scriptedWorld) sent(injection) { w.injSent = true; w.calls = append(w.calls, "sent") }
func (w *scriptedWorld) answered(_ zerolog.Logger, host string, ev wire.Event) {
	w.calls = append(w.calls, "answered "+ev.Ev+" "+host)
}
func (w *scriptedWorld) checkpointCues(time.Time, time.Duration) []checkpointCue {
	return []checkpointCue{{at: w.start.Add(w.cueAt), why: "scripted"}}
}
func (w *scriptedWorld) cues() <-chan checkpointCue       { return nil }
func (w *scriptedWorld) checkpointSignal() syscall.Signal { return syscall.SIGUSR1 }
func (w *scriptedWorld) checkpointSent(c checkpointCue, _ time.Time) {
	w.calls = append(w.calls, "checkpoint "+c.why)
}
func (w *scriptedWorld) ranksStarted(time.Time) { w.calls = append(w.calls, "ranks started") }
func (w *scriptedWorld) firstStep(rank int, step int64, _ time.Time) {
	w.calls = append(w.calls, "step")
}
func (w *scriptedWorld) failed(d failure, _ time.Time) {
	w.calls = append(w.calls, "failed "+d.String())
}
func (w *scriptedWorld) saw(fs []failure, _ time.Time) { w.failures = append(w.failures, fs...) }
func (w *scriptedWorld) noticed([]failure, time.Time)  {}

// The job loop sends the world's checkpoint signal and its injection when
// each is due, and no earlier, and tells the world what happened: every
// rank started, the injection's answer, the failure that followed; after
// the failure nothing more is sent into the world but the teardown.
func TestLoopWorldHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &scriptedWorld{inj: injection{id: 0, kind: "kill", ranks: []int{1}, sig: syscall.SIGKILL}, injAt: 3 * time.Second, cueAt: 2 * time.Second,
			start: time.Now()}
		cfg := testConfig()
		f := startFakeJobIn(t, 2, cfg, w)
		f.expectNone()
		time.Sleep(2*time.Second - time.Millisecond)
		f.expectNone()
		time.Sleep(time.Millisecond)
		f.expect("signal", syscall.SIGUSR1)
		time.Sleep(time.Second - time.Millisecond)
		f.expectNone()
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if c := <-f.cmds; c.Op != "inject" || !slices.Equal(c.Ranks, []int{1}) || syscall.Signal(c.Signal) != syscall.SIGKILL {
			t.Fatalf("command %+v, want inject SIGKILL into rank 1", c)
		}
		f.events <- wire.Event{Ev: "injected", Rank: 1, PID: 1001}
		f.exit(1, 0, syscall.SIGKILL)
		f.expect("signal", syscall.SIGTERM)
		f.exit(0, 0, syscall.SIGTERM)
		err := f.done()
		var re *outcome.RankExitError
		if !errors.As(err, &re) || re.Rank != 1 || re.Signal != syscall.SIGKILL {
			t.Fatalf("err = %v, want rank 1 killed by SIGKILL", err)
		}
		want := []string{"ranks started", "checkpoint scripted", "sent", "answered injected localhost", "failed rank 1 killed by SIGKILL"}
		if !slices.Equal(w.calls, want) {
			t.Errorf("the world was told %q, want %q", w.calls, want)
		}
		if len(w.failures) != 1 || w.failures[0].rank != 1 {
			t.Errorf("the world saw %+v, want rank 1's failure alone", w.failures)
		}
	})
}
