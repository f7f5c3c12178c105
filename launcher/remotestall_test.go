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
}

func (l *lateConn) SetReadDeadline(t time.Time) error {
	l.firstSet.Do(func() { l.first <- t })
	return l.Conn.SetReadDeadline(t)
}

func (l *lateConn) Read(b []byte) (int, error) {
	n, err := l.Conn.Read(b)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		l.once.Do(func() { time.Sleep(l.stall) })
	}
	return n, err
}

// gorun's lease on a remote agent discounts gorun's own lateness: a gorun
// starved past its read deadline, while the agent's ping waited in the
// connection, reads the ping and calls no one silent (remote.go readHost,
// notes/verdicts.md). A gorun that was on time and heard nothing for the
// lease still names the agent silent.
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
			gorunEnd, agentEnd := net.Pipe()
			defer agentEnd.Close()
			agent := wire.NewConn(agentEnd, nil)
			late := &lateConn{Conn: gorunEnd, stall: tc.stall, first: make(chan time.Time, 1)}
			c := &hostConn{w: wire.NewConn(late, nil)}
			returned := make(chan struct{})
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() {
				defer agentEnd.Close()
				// From gorun's deadline, not from this goroutine's start:
				// the test's own goroutine may run late before it sets it.
				select {
				case d := <-late.first:
					time.Sleep(time.Until(d.Add(tc.ping)))
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
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("readHost: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
