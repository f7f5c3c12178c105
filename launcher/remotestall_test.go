package launcher

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// lateConn is gorun's end of an agent connection in a gorun that was not
// run for stall past its first read deadline: that read's timeout comes
// back stall late, as a starved process sees it.
type lateConn struct {
	net.Conn
	stall time.Duration
	once  sync.Once
	// first receives the first read deadline gorun sets: the agent times
	// its ping from it.
	first    chan time.Time
	firstSet sync.Once
	deadline time.Time
	// late is how late the first timed-out read came back before its
	// stall: how late the machine ran gorun. Read after readHost returns.
	late time.Duration
}

func (l *lateConn) SetReadDeadline(t time.Time) error {
	l.firstSet.Do(func() { l.deadline = t; l.first <- t })
	return l.Conn.SetReadDeadline(t)
}

func (l *lateConn) Read(b []byte) (int, error) {
	n, err := l.Conn.Read(b)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		l.once.Do(func() { l.late = time.Since(l.deadline); time.Sleep(l.stall) })
	}
	return n, err
}

// gorun's lease on a remote agent discounts gorun's own lateness: a gorun
// starved past its read deadline, while the agent's ping waited in the
// connection, reads the ping and calls no one silent (remote.go readHost,
// notes/verdicts.md). A gorun that was on time and heard nothing for the
// lease still names the agent silent.
//
// The agent pings at a time after gorun's first deadline; gorun, late by
// L past it, waits min(L, lease) more, so a ping 2×lease after the
// deadline reaches a gorun the machine itself ran a lease late or more,
// as it should. Such a run does not show the on-time case: the silent
// agent's case is run again when the machine ran gorun half a lease late
// (a -race run beside a load of 15 did, once in a hundred).
func TestReadHostDiscountsOwnStall(t *testing.T) {
	const lease = 200 * time.Millisecond
	for _, tc := range []struct {
		name  string
		stall time.Duration // how late gorun's first deadline wakes it
		ping  time.Duration // when the agent pings, after the deadline
		want  string
	}{
		// The ping came while gorun was not running: not a silence.
		{"starved observer", 3 * lease / 2, lease / 2, "connection to its agent closed"},
		// On time, and the agent said nothing for the lease.
		{"silent agent", 0, 2 * lease, "no word from its agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for try := 1; ; try++ {
				late, err := readHostOnce(lease, tc.stall, tc.ping)
				if tc.stall == 0 && late >= lease/2 && try < 5 {
					t.Logf("try %d: gorun's first deadline woke %v late (%v): not on time, again", try, late, err)
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("readHost (try %d, deadline woke %v late): %v, want an error saying %q", try, late, err, tc.want)
				}
				return
			}
		})
	}
}

// readHostOnce runs readHost over a pipe whose agent end pings once, ping
// after gorun's first read deadline, and closes; gorun's first timed-out
// read comes back stall late. It returns how late the machine ran gorun
// past that deadline (before the stall) and readHost's error.
func readHostOnce(lease, stall, ping time.Duration) (time.Duration, error) {
	gorunEnd, agentEnd := net.Pipe()
	defer agentEnd.Close()
	agent := wire.NewConn(agentEnd, nil)
	late := &lateConn{Conn: gorunEnd, stall: stall, first: make(chan time.Time, 1)}
	c := &hostConn{w: wire.NewConn(late, nil)}
	returned := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		defer agentEnd.Close()
		// From gorun's deadline, not from this goroutine's start: the
		// test's own goroutine may run late before it sets it.
		select {
		case d := <-late.first:
			time.Sleep(time.Until(d.Add(ping)))
		case <-returned:
			return
		}
		_ = agent.WriteFrame(wire.FramePing)
	})
	m := &hostAgents{}
	err := m.readHost(c, plan.Node{Ranks: 1}, lease, make(chan wire.Event, 1), make(chan struct{}),
		func(int, byte, []byte) {})
	close(returned)
	gorunEnd.Close()
	return late.late, err
}
