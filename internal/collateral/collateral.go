// Package collateral carries two facts from a rank's runtime to its
// supervisor: "this rank is failing because another rank was lost (or
// aborted), not on its own" (Report), and "this rank has finished training
// step N" (Step, what --inject ...:after-steps=N fires on). Without it the launcher sees only exit codes,
// and with N ranks and one killed, the first exit it reaps is as often a
// peer that gave up as the rank that died; the job's final line then named
// the wrong rank.
//
// The channel is a pipe whose write end every rank inherits at the
// descriptor named by rankenv.CollateralFD. A pipe rather than a socket or
// file: it is private to the job's processes, needs no path to clean up,
// and a write of at most PIPE_BUF bytes is atomic, so lines from ranks
// writing at once never interleave. The supervisor reads it after each
// rank it reaps (a report is written before the failing call returns, so
// before the rank can exit), which makes "reported, then exited" a
// certainty instead of a race.
package collateral

import (
	"encoding/json"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/gorun-hpc/gorun/rankenv"
)

// Report is one line on the pipe.
type Report struct {
	// Rank is the world rank of the reporting process.
	Rank int `json:"rank"`
	// Blame is the world rank the reporter holds responsible (the peer it
	// lost, or that aborted), -1 when it cannot tell.
	Blame int `json:"blame"`
	// Why is the runtime's error text, cut to fit one atomic write.
	Why string `json:"why"`
	// Relay is set when the reporter did not see the loss itself: Blame
	// aborted and told it (an abort travels from peer to peer, so the
	// reports of a whole ring can blame each other in a cycle; the one
	// report without Relay is where it began).
	Relay bool `json:"relay,omitempty"`
	// Desync is set when the failure is a desync (ranks issued different
	// calls): Why then names both calls and the ranks on each side, and
	// Blame is the lowest rank of the strictly smaller side, -1 when the
	// sides are equal (no rank can be said to be the one that differed).
	Desync bool `json:"desync,omitempty"`
}

// maxLine keeps a line within PIPE_BUF (4096 on Linux), so that concurrent
// writers never interleave.
const maxLine = 4096

// Encode returns r as one line of at most maxLine bytes.
func Encode(r Report) []byte {
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return nil
		}
		if len(b)+1 <= maxLine || r.Why == "" {
			return append(b, '\n')
		}
		r.Why = r.Why[:len(r.Why)/2]
	}
}

// Decode parses one line; ok is false for anything that is not a report
// (a step line included).
func Decode(line []byte) (Report, bool) {
	var r struct {
		Report
		Step *int64 `json:"step"`
	}
	if err := json.Unmarshal(line, &r); err != nil || r.Rank < 0 || r.Step != nil {
		return Report{}, false
	}
	return r.Report, true
}

// Step is a progress line: Rank has finished training step Step (the
// program's own numbering, 1-based; a resumed run goes on from its
// checkpoint's number). Lines carry the number, not an increment, so a
// lost line (a full pipe) costs nothing but latency: the next one says
// the same and more.
type Step struct {
	Rank int   `json:"rank"`
	Step int64 `json:"step"`
}

// EncodeStep returns s as one line.
func EncodeStep(s Step) []byte {
	// Formatted by hand: this runs once per training step, and a line of
	// two integers needs no reflection.
	b := make([]byte, 0, 48)
	b = append(b, `{"rank":`...)
	b = strconv.AppendInt(b, int64(s.Rank), 10)
	b = append(b, `,"step":`...)
	b = strconv.AppendInt(b, s.Step, 10)
	return append(b, "}\n"...)
}

// DecodeStep parses one line; ok is false for anything that is not a
// step line.
func DecodeStep(line []byte) (Step, bool) {
	var s struct {
		Rank *int   `json:"rank"`
		Step *int64 `json:"step"`
	}
	if err := json.Unmarshal(line, &s); err != nil || s.Rank == nil || s.Step == nil || *s.Rank < 0 || *s.Step < 0 {
		return Step{}, false
	}
	return Step{Rank: *s.Rank, Step: *s.Step}, true
}

var (
	fdOnce sync.Once
	fd     = -1
)

// reportFD returns the inherited descriptor, or -1 when this process was
// not started by gorun (or the descriptor is not a pipe any more). It is
// marked close-on-exec on first use: programs the rank execs are not
// gorun's runtime and must not inherit it.
func reportFD() int {
	fdOnce.Do(func() {
		n, err := strconv.Atoi(os.Getenv(rankenv.CollateralFD))
		if err != nil || n < 3 {
			return
		}
		var st syscall.Stat_t
		if syscall.Fstat(n, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			// Closed, or reused for something else by the program:
			// writing there would corrupt its file.
			return
		}
		syscall.CloseOnExec(n)
		fd = n
	})
	return fd
}

// Claim takes the inherited descriptor for this process's runtime: it
// is marked close-on-exec at once, so that programs the rank starts later
// do not inherit it. The runtime calls it when a communicator is made;
// Tell works without it.
func Claim() { reportFD() }

// TellStep writes a step line to the supervisor's pipe; a no-op outside
// gorun. Like Tell it never blocks; a line lost to a full pipe is made up
// for by the next.
func TellStep(s Step) {
	n := reportFD()
	if n < 0 {
		return
	}
	_, _ = syscall.Write(n, EncodeStep(s))
}

// Tell writes r to the supervisor's pipe; a no-op outside gorun. It never
// blocks: the pipe is non-blocking, and a full pipe (which one line per
// failing rank cannot fill) loses the report rather than the rank.
func Tell(r Report) {
	n := reportFD()
	if n < 0 {
		return
	}
	if b := Encode(r); b != nil {
		_, _ = syscall.Write(n, b)
	}
}
