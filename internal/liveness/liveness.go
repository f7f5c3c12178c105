// Package liveness judges a silent peer process on the same host: when a
// stream's lease runs out (no frame, not even a beat, for the lease), is
// the process at the other end frozen, dead, or only starved of CPU?
//
// Silence alone cannot tell. A stopped process (SIGSTOP, a debugger) and a
// healthy one that a loaded machine did not schedule for a few seconds
// both send nothing. But the kernel can tell, for a process on this host:
// /proc/PID/stat says whether it is stopped (state T or t) or gone, and
// the CPU time of its threads (/proc/PID/task/*/schedstat, nanoseconds)
// says whether it ran since the last look. The Judge turns that evidence
// into a verdict; the rule and its reasons are in notes/verdicts.md.
//
// It owns the rule and the reading of /proc; the streams it judges (the
// rendezvous' attach streams, the launcher's supervisor pipes) own their
// leases and what a verdict does.
package liveness

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Sample is what the kernel says about one process at one moment.
type Sample struct {
	// Gone: no such process, or a zombie (it exited; its parent has not
	// reaped it yet).
	Gone bool
	// State is /proc/PID/stat's state letter: R running or runnable, S
	// sleeping, D uninterruptible (I/O, memory reclaim), T stopped, t
	// traced, ... 0 when unknown.
	State byte
	// CPU is the CPU time all its threads have had so far.
	CPU time.Duration
}

// Stopped reports whether the process is stopped (SIGSTOP, SIGTSTP, a
// debugger): it cannot run until someone continues it.
func (s Sample) Stopped() bool { return s.State == 'T' || s.State == 't' }

// Sampler reads a process's Sample. ok is false when there is no
// evidence to be had (no /proc, another host's pid): the judge then falls
// back to the lease alone.
type Sampler func(pid int) (s Sample, ok bool)

// ReadProc is the Sampler of this host's /proc. This process itself is
// sampled without /proc (selfSample).
func ReadProc(pid int) (Sample, bool) {
	if pid <= 0 {
		return Sample{}, false
	}
	if pid == self {
		if s, ok := selfSample(); ok {
			return s, true
		}
	}
	p := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(p + "/stat")
	if err != nil {
		if os.IsNotExist(err) {
			return Sample{Gone: true}, true
		}
		return Sample{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return Sample{}, false
	}
	s := Sample{State: b[i+2]}
	if s.State == 'Z' || s.State == 'X' {
		return Sample{Gone: true, State: s.State}, true
	}
	s.CPU = cpuOf(p, b[i+2:])
	return s, true
}

// self is this process's id.
var self = os.Getpid()

// selfSample is this process's Sample: it runs (it is reading; /proc
// would say R as well), and its CPU time is getrusage's, every thread's
// that ever ran, so it never goes back when a thread exits, as the sum
// over /proc's live threads can. One system call (~0.5 µs here) instead
// of reading every thread's schedstat (~0.1 ms at 8 threads, more with
// more), which every stream judging a peer in this process pays per look:
// thousands of ranks in one process (a benchmark, streams that name this
// process as their peer) judge thousands of starved streams a second.
func selfSample() (Sample, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return Sample{}, false
	}
	return Sample{State: 'R', CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}, true
}

// cpuOf sums the CPU time of every thread of the process at p, in
// nanoseconds from each thread's schedstat; where schedstat is missing,
// stat's utime+stime (fields 14 and 15, clock ticks, assumed 100 Hz).
func cpuOf(p string, afterComm []byte) time.Duration {
	if d, err := os.Open(p + "/task"); err == nil {
		names, _ := d.Readdirnames(-1)
		d.Close()
		var sum time.Duration
		n := 0
		for _, t := range names {
			b, err := os.ReadFile(p + "/task/" + t + "/schedstat")
			if err != nil {
				continue
			}
			f := bytes.Fields(b)
			if len(f) == 0 {
				continue
			}
			if v, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
				sum += time.Duration(v)
				n++
			}
		}
		if n > 0 {
			return sum
		}
	}
	f := bytes.Fields(afterComm) // state is f[0]: utime is field 14, f[11]
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(string(f[11]), 10, 64)
	s, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// Verdict is the judge's answer when a lease runs out.
type Verdict int

const (
	// Wait: the peer is alive (it ran, or it waits for the CPU or for
	// the disk); look again after Judge.Recheck.
	Wait Verdict = iota
	// Frozen: the peer is stopped.
	Frozen
	// Gone: the peer exited (its stream's end will say how).
	Gone
	// Silent: the peer neither sent anything nor ran, or it stayed
	// silent past Judge.Limit while it ran: unresponsive.
	Silent
)

func (v Verdict) String() string {
	switch v {
	case Wait:
		return "alive (starved)"
	case Frozen:
		return "frozen"
	case Gone:
		return "gone"
	case Silent:
		return "silent"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Judge judges one stream's peer. It is used by the one goroutine that
// reads the stream: not safe for concurrent use.
type Judge struct {
	// PID is the peer's process on this host; 0 when unknown or remote
	// (no evidence: the lease alone decides).
	PID int
	// Sample reads the evidence; nil is ReadProc.
	Sample Sampler
	// Lease is how long a silence is judged by the lease alone: shorter
	// silences are never judged.
	Lease time.Duration
	// Recheck is how long after a Wait the judge looks again; a look
	// sooner than that after the last one waits (Expired may be called
	// on every tick of a faster clock).
	Recheck time.Duration
	// Limit is the longest silence of a peer that runs: past it the
	// peer is Silent whatever /proc says (a process whose runtime runs
	// but whose stream never speaks is of no use to its job). 0: no
	// limit.
	Limit time.Duration

	last    Sample
	lastAt  time.Duration // the silence at the last look
	sampled bool
}

// Heard resets the judge: the peer sent something.
func (j *Judge) Heard() { j.sampled = false }

// Expired is called when the stream has been silent for silent (at least
// Lease): the verdict, and a short reason for a log line or an error.
func (j *Judge) Expired(silent time.Duration) (Verdict, string) {
	if j.PID <= 0 {
		return Silent, "no evidence of its process (not on this host)"
	}
	sample := j.Sample
	if sample == nil {
		sample = ReadProc
	}
	s, ok := sample(j.PID)
	switch {
	case !ok:
		return Silent, "its process could not be read"
	case s.Gone:
		return Gone, "its process exited"
	case s.Stopped():
		return Frozen, fmt.Sprintf("its process is stopped (state %c)", s.State)
	case j.Limit > 0 && silent >= j.Limit:
		return Silent, fmt.Sprintf("silent for %s although its process runs (state %c): unresponsive", silent.Round(time.Millisecond), s.State)
	}
	if j.sampled && silent-j.lastAt < j.Recheck {
		// Too soon after the last look to say it did not run: a
		// healthy idle process wakes only for its timers.
		return Wait, "looked again too soon to judge"
	}
	prev, prevAt, had := j.last, j.lastAt, j.sampled
	j.last, j.sampled, j.lastAt = s, true, silent
	switch {
	case !had:
		// First look: one sample says nothing about progress. Alive
		// until the next look shows otherwise.
		return Wait, fmt.Sprintf("its process is alive (state %c); looking again", s.State)
	case s.CPU > prev.CPU:
		return Wait, fmt.Sprintf("its process ran %s since the last look (state %c): starved, not frozen", (s.CPU - prev.CPU).Round(time.Microsecond), s.State)
	case s.State == 'R' || s.State == 'D':
		return Wait, fmt.Sprintf("its process waits for the CPU or the disk (state %c): starved, not frozen", s.State)
	}
	return Silent, fmt.Sprintf("its process neither ran nor spoke for %s (state %c): unresponsive", (silent - prevAt).Round(time.Millisecond), s.State)
}

// StallMeter measures the observer's own scheduling delay, the evidence
// a judge has about a peer on another host, whose process it cannot see:
// a lease is a claim that the peer would have spoken within it, and that
// holds only for time during which the observer itself could run and
// read. Tick is called from a ticker of Period; whatever a tick is late
// beyond the period (plus Slack) is time the observer could not run — a
// stall — and Since says how much of it fell after a moment. A judge then
// counts a silence as its length less the stalls within it: a starved
// observer does not call its peer silent for its own lost time, while a
// peer that is silent as the observer runs on schedule is named at the
// lease. Not safe for concurrent use: one goroutine ticks and judges.
type StallMeter struct {
	Period, Slack time.Duration
	last          time.Time
	stalls        []stall // oldest first, pruned by Since's callers' horizon
}

type stall struct {
	end time.Time // when the late tick came
	d   time.Duration
}

// Tick records a tick at now.
func (m *StallMeter) Tick(now time.Time) {
	if !m.last.IsZero() {
		if late := now.Sub(m.last) - m.Period - m.Slack; late > 0 {
			m.stalls = append(m.stalls, stall{end: now, d: late})
		}
	}
	m.last = now
}

// Since is the observer's stalled time after t, and forgets stalls that
// ended before t (callers ask about ever later moments).
func (m *StallMeter) Since(t time.Time) time.Duration {
	i := 0
	for i < len(m.stalls) && !m.stalls[i].end.After(t) {
		i++
	}
	m.stalls = m.stalls[i:]
	var sum time.Duration
	for _, s := range m.stalls {
		// A stall that began before t counts only from t.
		sum += min(s.d, s.end.Sub(t))
	}
	return sum
}
