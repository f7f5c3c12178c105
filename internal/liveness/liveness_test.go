package liveness

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// The rule, step by step, with the kernel faked: each row is a sequence
// of looks (the silence so far and what /proc says) and the verdicts
// they must give.
func TestJudge(t *testing.T) {
	const lease, recheck, limit = 4 * time.Second, time.Second, 60 * time.Second
	type look struct {
		silent time.Duration
		s      Sample
		ok     bool
		want   Verdict
	}
	run := func(s Sample) look { return look{s: s, ok: true} }
	at := func(l look, silent time.Duration, want Verdict) look { l.silent, l.want = silent, want; return l }
	for _, tc := range []struct {
		name  string
		pid   int
		looks []look
	}{
		{"stopped at the first look", 7, []look{at(run(Sample{State: 'T'}), lease, Frozen)}},
		{"traced at the first look", 7, []look{at(run(Sample{State: 't'}), lease, Frozen)}},
		{"gone", 7, []look{at(run(Sample{Gone: true}), lease, Gone)}},
		{"no pid: the lease alone", 0, []look{at(run(Sample{State: 'R'}), lease, Silent)}},
		{"unreadable: the lease alone", 7, []look{at(look{}, lease, Silent)}},
		{"running, then ran again: starved", 7, []look{
			at(run(Sample{State: 'S', CPU: 10}), lease, Wait),
			at(run(Sample{State: 'S', CPU: 11}), lease+recheck, Wait),
			at(run(Sample{State: 'R', CPU: 11}), lease+2*recheck, Wait),
			at(run(Sample{State: 'D', CPU: 11}), lease+3*recheck, Wait),
			at(run(Sample{State: 'T', CPU: 11}), lease+4*recheck, Frozen),
		}},
		{"asleep without running", 7, []look{
			at(run(Sample{State: 'S', CPU: 10}), lease, Wait),
			at(run(Sample{State: 'S', CPU: 10}), lease+recheck, Silent),
		}},
		{"too soon to tell", 7, []look{
			at(run(Sample{State: 'S', CPU: 10}), lease, Wait),
			at(run(Sample{State: 'S', CPU: 10}), lease+recheck/2, Wait),
			at(run(Sample{State: 'S', CPU: 10}), lease+recheck, Silent),
		}},
		{"running past the limit", 7, []look{
			at(run(Sample{State: 'R', CPU: 10}), lease, Wait),
			at(run(Sample{State: 'R', CPU: 20}), limit-recheck, Wait),
			at(run(Sample{State: 'R', CPU: 30}), limit, Silent),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			j := Judge{PID: tc.pid, Lease: lease, Recheck: recheck, Limit: limit}
			j.Sample = func(int) (Sample, bool) { return tc.looks[i].s, tc.looks[i].ok }
			for i = range tc.looks {
				if v, why := j.Expired(tc.looks[i].silent); v != tc.looks[i].want {
					t.Fatalf("look %d (silent %v): %v (%s), want %v", i, tc.looks[i].silent, v, why, tc.looks[i].want)
				}
			}
		})
	}
	// Heard forgets the last look: the next silence starts afresh.
	j := Judge{PID: 7, Lease: lease, Recheck: recheck}
	j.Sample = func(int) (Sample, bool) { return Sample{State: 'S', CPU: 10}, true }
	j.Expired(lease)
	j.Heard()
	if v, _ := j.Expired(lease + recheck); v != Wait {
		t.Errorf("after Heard, a first look gave %v, want Wait", v)
	}
}

// ReadProc on real processes: this one runs and has used CPU; a stopped
// child is stopped; a child that exited and was reaped is gone, and so is
// one that exited and was not (a zombie).
func TestReadProc(t *testing.T) {
	s, ok := ReadProc(os.Getpid())
	if !ok || s.Gone || s.Stopped() || s.CPU <= 0 {
		t.Fatalf("this process: %+v ok=%v, want alive with CPU time", s, ok)
	}
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pid := c.Process.Pid
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s, _ = ReadProc(pid); !s.Stopped() && time.Now().Before(deadline); s, _ = ReadProc(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	if !s.Stopped() {
		t.Errorf("SIGSTOPped child: %+v, want stopped", s)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for s, _ = ReadProc(pid); !s.Gone && time.Now().Before(deadline); s, _ = ReadProc(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	if !s.Gone {
		t.Errorf("killed, unreaped child: %+v, want gone (a zombie)", s)
	}
	_ = c.Wait()
	if s, ok = ReadProc(pid); !ok || !s.Gone {
		t.Errorf("reaped child: %+v ok=%v, want gone", s, ok)
	}
}

// This process sampled without /proc: running, its CPU time growing as
// it works, and matching what /proc says of it to within the threads
// that have exited (getrusage counts them, /proc's thread files do not).
func TestReadProcSelf(t *testing.T) {
	a, ok := ReadProc(os.Getpid())
	if !ok || a.Gone || a.State != 'R' || a.CPU <= 0 {
		t.Fatalf("this process: %+v ok=%v, want running with CPU time", a, ok)
	}
	for x, end := 0, time.Now().Add(20*time.Millisecond); time.Now().Before(end); x++ {
		_ = x * x
	}
	b, _ := ReadProc(os.Getpid())
	if b.CPU <= a.CPU {
		t.Errorf("CPU time %v after 20 ms of work, want more than %v", b.CPU, a.CPU)
	}
	p := cpuOf("/proc/self", []byte("R"))
	if p <= 0 || p > b.CPU+time.Second {
		t.Errorf("/proc says %v of CPU, getrusage %v: far apart", p, b.CPU)
	}
}

// The observer's stalls: late ticks are stalls, on-time ticks are not,
// and Since counts only what fell after its moment.
func TestStallMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := StallMeter{Period: 100 * time.Millisecond, Slack: 50 * time.Millisecond}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	m.Tick(ms(0))
	m.Tick(ms(100))  // on time
	m.Tick(ms(240))  // 40 ms late: within the slack
	m.Tick(ms(3340)) // 3 s stall (3100 − 100 period; the slack not counted)
	m.Tick(ms(3440))
	if got, want := m.Since(ms(0)), 2950*time.Millisecond; got != want {
		t.Errorf("Since(0) = %v, want %v", got, want)
	}
	// A moment inside the stall counts only the part after it.
	if got, want := m.Since(ms(2340)), time.Second; got != want {
		t.Errorf("Since(2340) = %v, want %v", got, want)
	}
	if got := m.Since(ms(3400)); got != 0 {
		t.Errorf("Since(3400) = %v, want 0: no stall after it", got)
	}
}
