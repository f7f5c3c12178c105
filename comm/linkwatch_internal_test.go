package comm

import (
	"testing"
	"time"
)

// The lease's judgement of one connection over a sequence of polls.
func TestLinkJudge(t *testing.T) {
	const lease = 4 * time.Second
	type poll struct {
		at       time.Duration // since the first poll
		awaiting bool
		sinceAck time.Duration
	}
	tests := []struct {
		name  string
		polls []poll
		cut   int // index of the poll that finds the cut; -1: none
	}{
		{"healthy busy link: acks keep coming", []poll{{0, true, 10 * time.Millisecond}, {time.Second, true, 0}, {5 * time.Second, true, time.Millisecond}}, -1},
		{"idle link, nothing awaited: an old ack is no evidence", []poll{{0, false, 9 * time.Second}, {5 * time.Second, false, 14 * time.Second}}, -1},
		{"data unacknowledged past the lease", []poll{{0, true, time.Second}, {2 * time.Second, true, 3 * time.Second}, {3 * time.Second, true, 4 * time.Second}}, 2},
		{"zero-window probe caught in its round trip, answered between polls", []poll{{0, false, 6 * time.Second}, {250 * time.Millisecond, true, 6 * time.Second}, {500 * time.Millisecond, false, 10 * time.Millisecond}}, -1},
		{"old ack but awaited for less than a quarter of the lease", []poll{{0, true, 5 * time.Second}, {500 * time.Millisecond, true, 5500 * time.Millisecond}}, -1},
		{"awaited a quarter of the lease and ack older than it", []poll{{0, true, 5 * time.Second}, {500 * time.Millisecond, true, 5500 * time.Millisecond}, {time.Second, true, 6 * time.Second}}, 2},
		{"a pause in awaiting restarts the count", []poll{{0, true, 3 * time.Second}, {900 * time.Millisecond, false, 3900 * time.Millisecond}, {time.Second, true, 4 * time.Second}, {1500 * time.Millisecond, true, 4500 * time.Millisecond}}, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var j linkJudge
			t0 := time.Unix(1000, 0)
			got := -1
			for i, p := range tc.polls {
				if j.judge(t0.Add(p.at), p.awaiting, p.sinceAck, lease) && got < 0 {
					got = i
				}
			}
			if got != tc.cut {
				t.Errorf("cut found at poll %d, want %d", got, tc.cut)
			}
		})
	}
}

// Keepalive probes start within a quarter of the lease (whole seconds),
// so that an idle cut link is judged within the lease.
func TestKeepAliveFollowsLease(t *testing.T) {
	tests := []struct {
		o          tcpOptions
		on         bool
		idle, intv time.Duration
	}{
		{tcpOptions{lease: 4 * time.Second}, true, time.Second, time.Second},
		{tcpOptions{lease: 16 * time.Second}, true, 4 * time.Second, 2 * time.Second},
		{tcpOptions{lease: 500 * time.Millisecond}, true, time.Second, time.Second},
		{tcpOptions{userTimeout: 10 * time.Second}, true, 5 * time.Second, time.Second},
		{tcpOptions{userTimeout: 10 * time.Second, lease: 4 * time.Second}, true, time.Second, time.Second},
		{tcpOptions{}, false, 0, 0},
	}
	for _, tc := range tests {
		ka := keepAlive(tc.o)
		if ka.Enable != tc.on || ka.Idle != tc.idle || ka.Interval != tc.intv {
			t.Errorf("keepAlive(%+v) = %+v, want on=%v idle=%v interval=%v", tc.o, ka, tc.on, tc.idle, tc.intv)
		}
	}
}
