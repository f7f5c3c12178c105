package comm

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func ar(seq uint64, count int) CallInfo {
	return CallInfo{Kind: KindAllReduce, DType: Float32, Op: Sum, Count: count, Root: -1, Seq: seq}
}

func bc(seq uint64) CallInfo {
	return CallInfo{Kind: KindBroadcast, DType: Float32, Count: 16, Root: 0, Seq: seq}
}

func done(calls ...CallInfo) []FlightRecord {
	out := make([]FlightRecord, len(calls))
	for i, c := range calls {
		out[i] = FlightRecord{Call: c, State: StateDone}
	}
	return out
}

func running(recs []FlightRecord) []FlightRecord {
	recs[len(recs)-1].State = StateRunning
	return recs
}

func TestDiagnose(t *testing.T) {
	sec := int64(time.Second)
	tests := []struct {
		name       string
		sts        []*rankStatus
		why        []string
		desyncAt   uint64 // 0: none
		mineRanks  []int
		theirRanks []int
		behind     []int
		report     []string // substrings
	}{{
		name: "split at #2 after an agreed #1",
		sts: []*rankStatus{
			{Rank: 0, Records: running(done(ar(1, 16), ar(2, 16)))},
			{Rank: 1, Records: running(done(ar(1, 16), ar(2, 16)))},
			{Rank: 2, Records: running(done(ar(1, 16), bc(2)))},
		},
		desyncAt: 2, mineRanks: []int{0, 1}, theirRanks: []int{2},
	}, {
		name: "a different count is a desync",
		sts: []*rankStatus{
			{Rank: 0, Records: running(done(ar(1, 16)))},
			{Rank: 1, Records: running(done(ar(1, 17)))},
		},
		desyncAt: 1, mineRanks: []int{0}, theirRanks: []int{1},
	}, {
		name: "a finished mismatched call counts (the root of a broadcast)",
		sts: []*rankStatus{
			{Rank: 0, Records: done(bc(1))},
			{Rank: 1, Records: running(done(ar(1, 16)))},
		},
		desyncAt: 1, mineRanks: []int{0}, theirRanks: []int{1},
	}, {
		name: "AllToAllV totals differ legitimately",
		sts: []*rankStatus{
			{Rank: 0, Records: running(done(CallInfo{Kind: KindAllToAllV, DType: Float32, Count: 3, Root: -1, Seq: 1}))},
			{Rank: 1, Records: running(done(CallInfo{Kind: KindAllToAllV, DType: Float32, Count: 9, Root: -1, Seq: 1}))},
		},
		report: []string{"rank 0 waits in AllToAllV(float32, count=3) #1", "rank 1 waits in AllToAllV(float32, count=9) #1"},
	}, {
		name: "an idle straggler is named first",
		sts: []*rankStatus{
			{Rank: 0, Records: running(done(ar(1, 16), ar(2, 16))), AgeNs: 2 * sec},
			{Rank: 1, Records: done(ar(1, 16)), AgeNs: 3 * sec},
			{Rank: 2, Records: running(done(ar(1, 16), ar(2, 16))), AgeNs: 2 * sec},
		},
		behind: []int{1},
		report: []string{"rank 1 is idle since AllReduce(float32 sum, count=16) #1 (has not issued #2) (3.0 s); ranks 0,2 wait in AllReduce(float32 sum, count=16) #2 (2.0 s)"},
	}, {
		name: "a rank stuck in an earlier call, one that does not answer",
		sts: []*rankStatus{
			{Rank: 0, Records: running(done(ar(1, 16), ar(2, 16)))},
			{Rank: 1, Records: running(done(ar(1, 16)))},
			nil,
		},
		why:    []string{"", "", "connection refused"},
		behind: []int{1},
		report: []string{"rank 1 is still in AllReduce(float32 sum, count=16) #1", "rank 2 does not answer: connection refused", "rank 0 waits in"},
	}, {
		name: "point-to-point records are not compared",
		sts: []*rankStatus{
			{Rank: 0, Records: running(done(ar(1, 16), FlightRecord{Call: CallInfo{Kind: KindSend, Root: 1, Seq: 1}, P2P: true}.Call, ar(2, 16)))},
			{Rank: 1, Records: running(done(ar(1, 16), ar(2, 16)))},
		},
		report: []string{"ranks 0-1 wait in"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, st := range tc.sts {
				if st == nil {
					continue
				}
				for i := range st.Records {
					st.Records[i].P2P = st.Records[i].Call.Kind == KindSend || st.Records[i].Call.Kind == KindRecv
				}
			}
			why := tc.why
			if why == nil {
				why = make([]string, len(tc.sts))
			}
			d := diagnose(0, tc.sts, why)
			switch {
			case tc.desyncAt != 0:
				if d.desync == nil {
					t.Fatalf("no desync; report %q", d.report)
				}
				if d.desync.Mine.Seq != tc.desyncAt || !slices.Equal(d.desync.MineRanks, tc.mineRanks) || !slices.Equal(d.desync.TheirRanks, tc.theirRanks) {
					t.Errorf("desync %v", d.desync)
				}
			case d.desync != nil:
				t.Fatalf("desync %v, want none", d.desync)
			}
			if want := len(tc.behind) == 0 && !slices.Contains(tc.sts, nil); tc.desyncAt == 0 && d.allIn != want {
				t.Errorf("allIn %v, want %v", d.allIn, want)
			}
			if !slices.Equal(d.behind, tc.behind) {
				t.Errorf("behind %v, want %v", d.behind, tc.behind)
			}
			for _, s := range tc.report {
				if !strings.Contains(d.report, s) {
					t.Errorf("report %q lacks %q", d.report, s)
				}
			}
		})
	}
}

// pt is a Send or Recv record: after collective seq, the n-th point-to-point
// call with peer.
func pt(kind Kind, peer int, seq, n uint64, count int, state CallState) FlightRecord {
	return FlightRecord{Call: CallInfo{Kind: kind, DType: Float32, Count: count, Root: peer, Seq: seq}, P2P: true, PeerSeq: n, State: state}
}

// Point-to-point calls pair off in order between two ranks: a Send meets
// the peer's Recv of the same size after the same collective, and a rank
// that went on to a collective without its partner call desynchronized.
func TestDiagnoseP2P(t *testing.T) {
	sent := pt(KindSend, 1, 1, 1, 16, StateRunning) // rank 0's Send to 1 after #1
	tests := []struct {
		name   string
		sts    []*rankStatus
		me     int
		mine   CallInfo // zero: no desync
		theirs CallInfo
	}{{
		name: "a Send to a rank in a collective",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: running(done(ar(1, 16), ar(2, 16))), P2P: []uint64{0, 0, 0}},
			{Rank: 2, Records: running(done(ar(1, 16), ar(2, 16))), P2P: []uint64{0, 0, 0}},
		},
		me: 1, mine: ar(2, 16), theirs: sent.Call,
	}, {
		name: "seen from the sender",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: running(done(ar(1, 16), ar(2, 16))), P2P: []uint64{0, 0, 0}},
			nil,
		},
		me: 0, mine: sent.Call, theirs: ar(2, 16),
	}, {
		name: "a Recv of another size",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: append(done(ar(1, 16)), pt(KindRecv, 0, 1, 1, 17, StateRunning))},
		},
		me: 1, mine: pt(KindRecv, 0, 1, 1, 17, "").Call, theirs: sent.Call,
	}, {
		name: "two Sends facing each other",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: append(done(ar(1, 16)), pt(KindSend, 0, 1, 1, 16, StateRunning))},
		},
		me: 0, mine: sent.Call, theirs: pt(KindSend, 0, 1, 1, 16, "").Call,
	}, {
		name: "the Recv comes after the next collective on the peer",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: append(done(ar(1, 16), ar(2, 16)), pt(KindRecv, 0, 2, 1, 16, StateRunning))},
		},
		me: 0, mine: sent.Call, theirs: pt(KindRecv, 0, 2, 1, 16, "").Call,
	}, {
		name: "a matching pair is only slow",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: append(done(ar(1, 16)), pt(KindRecv, 0, 1, 1, 16, StateRunning)), P2P: []uint64{1, 0}},
		},
	}, {
		name: "a peer that has not reached the Recv yet",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: done(ar(1, 16)), P2P: []uint64{0, 0}},
		},
	}, {
		name: "a peer whose Recv is older than its records",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: running(done(ar(2, 16))), P2P: []uint64{1, 0}},
		},
	}, {
		name: "a peer busy with a third rank",
		sts: []*rankStatus{
			{Rank: 0, Records: append(done(ar(1, 16)), sent)},
			{Rank: 1, Records: append(done(ar(1, 16)), pt(KindRecv, 2, 1, 1, 16, StateRunning)), P2P: []uint64{0, 0, 1}},
			{Rank: 2, Records: done(ar(1, 16)), P2P: []uint64{0, 0, 0}},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := diagnose(tc.me, tc.sts, make([]string, len(tc.sts)))
			if tc.mine == (CallInfo{}) {
				if d.desync != nil {
					t.Fatalf("desync %v, want none", d.desync)
				}
				return
			}
			if d.desync == nil {
				t.Fatalf("no desync; report %q", d.report)
			}
			if d.desync.Rank != tc.me || d.desync.Mine != tc.mine || d.desync.Theirs != tc.theirs {
				t.Errorf("desync %v\nwant rank %d called %v against %v", d.desync, tc.me, tc.mine, tc.theirs)
			}
		})
	}
}

// A peer that already failed with a desync hands its error on, turned to
// this rank's side.
func TestDiagnosePeerDesync(t *testing.T) {
	de := &DesyncError{Rank: 3, Mine: bc(7), Peer: 0, Theirs: ar(7, 16), MineRanks: []int{2, 3}, TheirRanks: []int{0, 1}}
	sts := []*rankStatus{
		{Rank: 0, Records: running(done(ar(7, 16)))},
		{Rank: 1, Records: running(done(ar(7, 16)))},
		{Rank: 2, Failed: de.Error(), Desync: de},
		{Rank: 3, Failed: de.Error(), Desync: de},
	}
	d := diagnose(1, sts, make([]string, 4))
	if d.peerDesync == nil || d.peerDesync.Rank != 1 || d.peerDesync.Mine.Kind != KindAllReduce || d.peerDesync.Peer != 3 {
		t.Fatalf("peer desync %+v", d.peerDesync)
	}
}

func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{[]int{3}, "rank 3"},
		{[]int{0, 1}, "ranks 0-1"},
		{[]int{5, 0, 1, 2, 7}, "ranks 0-2,5,7"},
		{[]int{0, 2, 4}, "ranks 0,2,4"},
	} {
		if got := rankList(tc.in); got != tc.want {
			t.Errorf("rankList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFlightTableUnit(t *testing.T) {
	dump := func(rank int, calls ...CallInfo) FlightDump {
		return FlightDump{Group: "g", Rank: rank, Size: 3, Host: "h", Records: done(calls...)}
	}
	tests := []struct {
		name  string
		dumps []FlightDump
		want  []string
	}{{
		name:  "different calls",
		dumps: []FlightDump{dump(0, ar(1, 16), ar(2, 16)), dump(1, ar(1, 16), ar(2, 16)), dump(2, ar(1, 16), bc(2))},
		want:  []string{">>  #2", "first disagreement at #2: ranks 0-1 called AllReduce(float32 sum, count=16) #2, rank 2 called Broadcast(float32, count=16, root=0) #2"},
	}, {
		name:  "a rank that never got there",
		dumps: []FlightDump{dump(0, ar(1, 16), ar(2, 16)), dump(1, ar(1, 16)), dump(2, ar(1, 16), ar(2, 16))},
		want:  []string{">>  #2", "first disagreement at #2: ranks 0,2 called AllReduce(float32 sum, count=16) #2; rank 1 never reached it"},
	}, {
		name: "different calls, and a rank that never got there",
		dumps: []FlightDump{dump(0, ar(1, 16)), dump(1, ar(1, 16), ar(2, 16)), dump(2, ar(1, 16), bc(2)),
			{Group: "g", Rank: 3, Size: 4, Host: "h", Records: done(ar(1, 16), bc(2))}},
		want: []string{">>  #2", "first disagreement at #2: rank 1 called AllReduce(float32 sum, count=16) #2, ranks 2-3 called Broadcast(float32, count=16, root=0) #2; rank 0 never reached it"},
	}, {
		name:  "agreement",
		dumps: []FlightDump{dump(0, ar(1, 16)), dump(1, ar(1, 16)), dump(2, ar(1, 16))},
		want:  []string{"the ranks agree on every recorded call"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			table := FlightTable(tc.dumps)
			for _, w := range tc.want {
				if !strings.Contains(table, w) {
					t.Errorf("table lacks %q:\n%s", w, table)
				}
			}
		})
	}
}
