package comm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Desync and stall detection off the fast path.
//
// A desync shows itself on the data path only when a frame of the wrong call
// reaches a rank that reads it; some pairs of algorithms never send one to
// the rank that would notice (a binomial broadcast against recursive
// doubling: each side waits for a message the other will never send), and
// those ranks would wait forever. So every communicator has a watchdog
// goroutine that looks, a few times per Config.DesyncCheckAfter, at the
// flight recorder's running call. Once a call has waited DesyncCheckAfter,
// the watchdog asks every other rank of the group for its recent flight
// records over the transport's side channel (StatusTransport: for Endpoint,
// a separate authenticated connection answered by the listener, not by the
// peer's communicator, so a peer stuck in a call still answers). The
// records are facts: two ranks whose records at one sequence number differ
// have desynchronized, whatever the timing of the snapshots. The watchdog
// then fails the communicator with a *DesyncError naming both calls and
// the ranks on each side; the abort reaches the peers, and every stuck rank
// runs the same comparison itself, so each fails within one check period
// even if the abort cannot reach it. When the records agree, the ranks that
// have not reached the call are stragglers: they are logged, at once and
// then at doubling intervals, and Config.StallTimeout can make that fatal.
//
// Cost when nothing is stuck: the flight recorder's two records per call
// (see recorder) and a timer tick a few times per second that reads them.
// No message is sent before a call has waited DesyncCheckAfter.
//
// Cost when stuck: asking every peer from every waiting rank would take
// n(n-1) side-channel connections per round (4032 at 64 ranks). Instead a
// waiting rank asks group rank 0 for its view of the group (one
// connection); rank 0 gathers every rank's status once (n-1 connections)
// and answers every asker from that one gather for a short while, so a
// round costs about 2(n-1) connections. Rank 0 answers from its listener
// like any status query, so a rank 0 stuck in a call still coordinates.
// Where rank 0 does not answer (dead, or its communicator closed), the
// waiting rank gathers from every peer itself, as before. The facts rank 0
// passes on are as good as the asker's own gather: records only grow, so
// a slightly older snapshot can delay a finding, never invent one.

// StatusTransport is the optional side channel a Transport offers for
// desync and stall diagnosis (Endpoint and commtest's in-memory network
// implement it; over a Transport without it a desync is found only from
// frames).
type StatusTransport interface {
	// ServeStatus answers queries for group gid with status() until the
	// returned function is called. Safe for concurrent use; does not block.
	ServeStatus(gid GroupID, status func() []byte) (withdraw func())
	// QueryStatus asks group rank r of g for its status of group gid. It
	// blocks until the answer arrives or ctx ends. Safe for concurrent use.
	QueryStatus(ctx context.Context, g Group, gid GroupID, r int) ([]byte, error)
}

// statusRecords is how many recent records a rank sends when asked.
const statusRecords = 64

// rankStatus is what a rank answers on the side channel.
type rankStatus struct {
	Rank    int            `json:"rank"`
	Records []FlightRecord `json:"records"` // oldest first
	// AgeNs is how long the last record has been running, or how long ago
	// it ended (the rank is idle).
	AgeNs int64 `json:"age_ns"`
	// P2P[r] is how many Sends and Recvs this rank has run with rank r
	// (so that a peer's Send missing from Records can be told apart from
	// one older than Records).
	P2P    []uint64     `json:"p2p,omitempty"`
	Failed string       `json:"failed,omitempty"`
	Desync *DesyncError `json:"desync,omitempty"`
}

func (c *Comm) localStatus(now time.Time) *rankStatus {
	recs, _, p2p := c.rec.last(statusRecords)
	st := &rankStatus{Rank: c.me, Records: recs, P2P: p2p}
	if n := len(st.Records); n > 0 {
		last := st.Records[n-1]
		if last.State == StateRunning {
			st.AgeNs = int64(now.Sub(last.Started))
		} else {
			st.AgeNs = int64(now.Sub(last.Ended))
		}
	}
	if err := c.Err(); err != nil {
		st.Failed = err.Error()
		var de *DesyncError
		if errors.As(err, &de) {
			st.Desync = de
		}
	}
	return st
}

// status is the side channel's answer for this communicator.
func (c *Comm) status() []byte {
	b, _ := json.Marshal(c.localStatus(time.Now()))
	return b
}

// watchdog checks the running call a few times per DesyncCheckAfter and,
// once it has waited that long, compares positions (at once, then at
// doubling intervals while the same call keeps waiting).
func (c *Comm) watchdog(st StatusTransport) {
	after := c.cfg.DesyncCheckAfter
	tick := time.NewTicker(max(after/4, time.Millisecond))
	defer tick.Stop()
	slot := ^uint64(0)
	var next time.Duration
	for {
		select {
		case <-c.watchStop:
			return
		case <-c.failed:
			return
		case <-tick.C:
		}
		rec, i, running := c.rec.running()
		if !running {
			continue
		}
		if i != slot {
			slot, next = i, after
		}
		waited := time.Since(rec.Started)
		if waited < next {
			continue
		}
		c.check(st, rec, waited)
		next = min(2*waited, waited+30*time.Second)
		if t := c.cfg.StallTimeout; t > waited && t < next {
			next = t
		}
	}
}

// check gathers every rank's status and acts on the diagnosis: a desync
// fails the communicator, a stall is logged (and fails it after
// StallTimeout).
func (c *Comm) check(st StatusTransport, rec FlightRecord, waited time.Duration) {
	c.checks.Add(1)
	sts, why := c.collect(st)
	d := diagnose(c.me, sts, why)
	if d.desync != nil {
		c.log.Error().Err(d.desync).Msg("comm: desync found by comparing every rank's calls")
		c.fail(d.desync)
		return
	}
	if d.peerDesync != nil {
		c.fail(d.peerDesync)
		return
	}
	// A call every rank is in (a large transfer on a slow link) is slow,
	// not stalled: say so quietly. A straggler, a silent or failed rank
	// is a warning.
	ev, what := c.log.Warn(), "comm: call stalled: "
	if d.allIn {
		ev, what = c.log.Info(), "comm: call still running on every rank: "
	}
	ev.Dur("waited", waited).Uint64("seq", rec.Call.Seq).Str("call", rec.Call.String()).
		Ints("behind", d.behind).Msg(what + d.report)
	if t := c.cfg.StallTimeout; t > 0 && waited >= t {
		c.fail(&StallError{Rank: c.me, Call: rec.Call, Waited: waited, Behind: d.behind, Report: d.report})
	}
}

// directCheck makes every rank gather from every peer itself, only so that
// a test can measure what the coordinated check saves (SetDirectCheck in
// export_test.go).
var directCheck atomic.Bool

// viewGID is the side-channel name under which a communicator answers
// with its view of the whole group (groupView) rather than its own status.
func viewGID(gid GroupID) GroupID { return gid ^ 0x9e3779b97f4a7c15 }

// groupStatus is a coordinator's answer: every rank's status as it
// gathered them (nil where a rank did not answer, Why saying why).
type groupStatus struct {
	Statuses []*rankStatus `json:"statuses"`
	Why      []string      `json:"why"`
}

// viewCache is the coordinator's latest gathered view, shared by the
// askers of one round.
type viewCache struct {
	mu   sync.Mutex
	at   time.Time     // when b was gathered
	b    []byte        // the encoded groupStatus
	busy chan struct{} // closed when the gather under way ends; nil if none
}

// queryTimeout bounds one side-channel query: DesyncCheckAfter, at least
// 200 ms, at most 2 s.
func (c *Comm) queryTimeout() time.Duration {
	return min(max(c.cfg.DesyncCheckAfter, 200*time.Millisecond), 2*time.Second)
}

// collect returns every rank's status: from group rank 0's view (one
// query; on rank 0, the view itself), or, in a group of two or where rank 0
// does not answer, by asking every peer.
func (c *Comm) collect(st StatusTransport) ([]*rankStatus, []string) {
	if c.n <= 2 || directCheck.Load() {
		return c.gather(st)
	}
	if c.me == 0 {
		// Rank 0's own check shares the view it serves the others.
		var gs groupStatus
		if err := json.Unmarshal(c.groupView(st), &gs); err != nil || len(gs.Statuses) != c.n || len(gs.Why) != c.n {
			return c.gather(st)
		}
		gs.Statuses[0], gs.Why[0] = c.localStatus(time.Now()), ""
		c.fill(st, gs.Statuses, gs.Why)
		return gs.Statuses, gs.Why
	}
	// Rank 0 gathers within queryTimeout; allow for that and the answer.
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.queryTimeout())
	defer cancel()
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() { // ends the query early when the communicator closes
		select {
		case <-c.watchStop:
			cancel()
		case <-done:
		}
	})
	b, err := st.QueryStatus(ctx, c.g, viewGID(c.gid), 0)
	close(done)
	wg.Wait()
	c.queries.Add(1)
	c.queryBytes.Add(int64(len(b)))
	var gs groupStatus
	if err == nil {
		err = json.Unmarshal(b, &gs)
	}
	if err == nil && (len(gs.Statuses) != c.n || len(gs.Why) != c.n) {
		err = fmt.Errorf("a view of %d ranks for a group of %d", len(gs.Statuses), c.n)
	}
	if err != nil {
		c.log.Debug().Err(err).Msg("comm: rank 0 gave no view of the group; asking every rank")
		return c.gather(st)
	}
	for r, s := range gs.Statuses {
		if s != nil && s.Rank != r {
			gs.Statuses[r], gs.Why[r] = nil, fmt.Sprintf("rank 0 has rank %d's status in its place", s.Rank)
		}
	}
	gs.Statuses[c.me], gs.Why[c.me] = c.localStatus(time.Now()), ""
	// Ranks rank 0 could not reach in time (a loaded host): ask them here,
	// so that one slow gather does not blind every rank for a round.
	c.fill(st, gs.Statuses, gs.Why)
	return gs.Statuses, gs.Why
}

// groupView is the side channel's answer under viewGID: every rank's
// status, gathered at most once per half DesyncCheckAfter however many
// ranks ask (one gather at a time; askers during it get its result).
// Each rank's records are cut to the newest 4096/n (at least 8), so that
// the answer stays near 1 MB at any size. Called by the transport's
// listener.
func (c *Comm) groupView(st StatusTransport) []byte {
	// The waiting ranks' watchdogs tick a quarter DesyncCheckAfter apart
	// at most, so half of it lets one gather serve a round.
	fresh := max(c.cfg.DesyncCheckAfter/2, 10*time.Millisecond)
	v := &c.view
	for {
		v.mu.Lock()
		if v.b != nil && time.Since(v.at) < fresh {
			b := v.b
			v.mu.Unlock()
			return b
		}
		if busy := v.busy; busy != nil {
			v.mu.Unlock()
			<-busy
			continue
		}
		busy := make(chan struct{})
		v.busy, v.b = busy, nil
		v.mu.Unlock()

		sts, why := c.gather(st)
		keep := max(4096/c.n, 8)
		for _, s := range sts {
			if s != nil && len(s.Records) > keep {
				s.Records = s.Records[len(s.Records)-keep:]
			}
		}
		b, _ := json.Marshal(groupStatus{Statuses: sts, Why: why})

		v.mu.Lock()
		// Fresh from when it is ready: a gather slow to finish (many
		// ranks on a loaded host) still serves the round that waited.
		v.b, v.at, v.busy = b, time.Now(), nil
		v.mu.Unlock()
		close(busy)
		return b
	}
}

// gather asks every peer for its status (fill). sts[r] is nil where rank
// r did not answer, and why[r] says why.
func (c *Comm) gather(st StatusTransport) (sts []*rankStatus, why []string) {
	sts, why = make([]*rankStatus, c.n), make([]string, c.n)
	sts[c.me] = c.localStatus(time.Now())
	c.fill(st, sts, why)
	return sts, why
}

// fill asks every rank whose status is missing from sts, in parallel, each
// bounded by queryTimeout, and records the answer or why there is none.
func (c *Comm) fill(st StatusTransport, sts []*rankStatus, why []string) {
	ctx, cancel := context.WithTimeout(context.Background(), c.queryTimeout())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { // ends the queries early when the communicator closes
		select {
		case <-c.watchStop:
			cancel()
		case <-ctx.Done():
		}
	})
	var qwg sync.WaitGroup
	for r := range c.n {
		if sts[r] != nil {
			continue
		}
		qwg.Go(func() {
			b, err := st.QueryStatus(ctx, c.g, c.gid, r)
			c.queries.Add(1)
			c.queryBytes.Add(int64(len(b)))
			if err != nil {
				why[r] = err.Error()
				return
			}
			var s rankStatus
			if err := json.Unmarshal(b, &s); err != nil || s.Rank != r {
				why[r] = fmt.Sprintf("unreadable status (%v)", err)
				return
			}
			sts[r], why[r] = &s, ""
		})
	}
	qwg.Wait()
	cancel()
	wg.Wait()
}

// diagnosis is the outcome of comparing every rank's status.
type diagnosis struct {
	desync     *DesyncError // records that differ at one sequence number
	peerDesync *DesyncError // a peer already failed with a desync
	behind     []int        // ranks that have not reached this rank's call
	report     string       // who is where, one clause per kind of position
	allIn      bool         // every rank answered and is in (or past) the call
}

// diagnose compares the ranks' statuses (sts[r] nil: no answer, why[r]
// says why) from rank me's point of view. Pure, for tests.
func diagnose(me int, sts []*rankStatus, why []string) diagnosis {
	var d diagnosis
	// Records by collective sequence number and rank.
	calls := map[uint64]map[int]CallInfo{}
	for r, st := range sts {
		if st == nil {
			continue
		}
		for _, rec := range st.Records {
			if rec.P2P {
				continue
			}
			if calls[rec.Call.Seq] == nil {
				calls[rec.Call.Seq] = map[int]CallInfo{}
			}
			calls[rec.Call.Seq][r] = rec.Call
		}
	}
	seqs := make([]uint64, 0, len(calls))
	for s := range calls {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	for _, s := range seqs {
		type side struct {
			call  CallInfo
			ranks []int
		}
		var sides []*side
		for r := range sts {
			ci, ok := calls[s][r]
			if !ok {
				continue
			}
			i := slices.IndexFunc(sides, func(sd *side) bool { return sd.call.sameCall(ci) })
			if i < 0 {
				sides = append(sides, &side{call: ci})
				i = len(sides) - 1
			}
			sides[i].ranks = append(sides[i].ranks, r)
		}
		if len(sides) < 2 {
			continue
		}
		mine := slices.IndexFunc(sides, func(sd *side) bool { return slices.Contains(sd.ranks, me) })
		if mine < 0 {
			mine = 0
		}
		theirs := 0
		if mine == 0 {
			theirs = 1
		}
		a, b := sides[mine], sides[theirs]
		rank := me
		if !slices.Contains(a.ranks, me) {
			rank = a.ranks[0]
		}
		d.desync = &DesyncError{Rank: rank, Mine: a.call, Peer: b.ranks[0], Theirs: b.call,
			MineRanks: a.ranks, TheirRanks: b.ranks,
			Detail: fmt.Sprintf("found by rank %d comparing every rank's calls", me)}
		break
	}
	// A Send or Recv after collective #s comes before collective #s+1:
	// report whichever disagreement comes first.
	if pd, at := p2pDesync(me, sts); pd != nil && (d.desync == nil || at < d.desync.Mine.Seq) {
		d.desync = pd
	}
	if d.desync != nil {
		return d
	}
	for _, st := range sts {
		if st != nil && st.Desync != nil && d.peerDesync == nil {
			d.peerDesync = st.Desync.turnedTo(me)
		}
	}
	d.behind, d.report = stallReport(me, sts, why)
	d.allIn = len(d.behind) == 0
	for _, st := range sts {
		if st == nil || st.Failed != "" {
			d.allIn = false
		}
	}
	return d
}

// p2pDesync compares point-to-point calls pair by pair, as frames are
// checked: rank r's n-th Send to or Recv from p (PeerSeq n) must meet p's
// n-th Recv from or Send to r, of the same dtype and count, after the same
// collective. Where p has run fewer than n calls with r but has already
// run a later collective, p went past the position without the partner
// call: a desync, whose other side is p's first call past the position.
// (Where p has run n or more but the n-th is older than its records, there
// is nothing to compare.)
// It returns the first such desync by position, and the collective the
// Send or Recv follows.
func p2pDesync(me int, sts []*rankStatus) (*DesyncError, uint64) {
	var first *DesyncError
	var at uint64
	found := func(de *DesyncError, seq uint64) {
		if first == nil || seq < at {
			first, at = de, seq
		}
	}
	for r, st := range sts {
		if st == nil {
			continue
		}
		for _, rec := range st.Records {
			p := rec.Call.Root
			if !rec.P2P || rec.PeerSeq == 0 || p < 0 || p >= len(sts) || p == r || sts[p] == nil {
				continue
			}
			ps := sts[p]
			if i := slices.IndexFunc(ps.Records, func(q FlightRecord) bool {
				return q.P2P && q.Call.Root == r && q.PeerSeq == rec.PeerSeq
			}); i >= 0 {
				if q := ps.Records[i].Call; !p2pPartners(rec.Call, q) {
					found(p2pError(me, r, rec.Call, p, q, fmt.Sprintf("call %d between ranks %d and %d", rec.PeerSeq, r, p)),
						min(rec.Call.Seq, q.Seq))
				}
				continue
			}
			if r < len(ps.P2P) && ps.P2P[r] >= rec.PeerSeq {
				continue // older than p's records
			}
			if i := slices.IndexFunc(ps.Records, func(q FlightRecord) bool { return q.Call.Seq > rec.Call.Seq }); i >= 0 {
				found(p2pError(me, r, rec.Call, p, ps.Records[i].Call,
					fmt.Sprintf("rank %d went past #%d without its call %d with rank %d", p, rec.Call.Seq, rec.PeerSeq, r)),
					rec.Call.Seq)
			}
		}
	}
	return first, at
}

// p2pPartners reports whether a and b, one rank's Send or Recv and its
// peer's call at the same place, pair off.
func p2pPartners(a, b CallInfo) bool {
	pair := (a.Kind == KindSend && b.Kind == KindRecv) || (a.Kind == KindRecv && b.Kind == KindSend)
	return pair && a.DType == b.DType && a.Count == b.Count && a.Seq == b.Seq
}

// p2pError is the desync between rank a's call ca and rank b's cb, as rank
// me reports it.
func p2pError(me, a int, ca CallInfo, b int, cb CallInfo, why string) *DesyncError {
	if me == b {
		a, ca, b, cb = b, cb, a, ca
	}
	return &DesyncError{Rank: a, Mine: ca, Peer: b, Theirs: cb, MineRanks: []int{a}, TheirRanks: []int{b},
		Detail: fmt.Sprintf("found by rank %d comparing every rank's calls: %s", me, why)}
}

// stallReport says where every rank is relative to rank me's running call,
// stragglers first: "rank 3 is still in Broadcast(...) #40 (2.1 s); ranks
// 0-2 wait in AllReduce(...) #41 (1.0 s)".
func stallReport(me int, sts []*rankStatus, why []string) (behind []int, report string) {
	var mySeq uint64
	if st := sts[me]; st != nil && len(st.Records) > 0 {
		mySeq = st.Records[len(st.Records)-1].Call.Seq
	}
	type clause struct {
		text   string
		order  int // stragglers first
		ranks  []int
		maxAge time.Duration
	}
	var clauses []*clause
	add := func(r, order int, age time.Duration, format string, args ...any) {
		text := fmt.Sprintf(format, args...)
		for _, cl := range clauses {
			if cl.text == text {
				cl.ranks = append(cl.ranks, r)
				cl.maxAge = max(cl.maxAge, age)
				return
			}
		}
		clauses = append(clauses, &clause{text: text, order: order, ranks: []int{r}, maxAge: age})
	}
	for r, st := range sts {
		if st == nil {
			add(r, 1, 0, "%s", "does not answer: "+why[r])
			continue
		}
		if st.Failed != "" {
			add(r, 1, 0, "%s", "has failed: "+st.Failed)
			continue
		}
		age := time.Duration(st.AgeNs)
		if len(st.Records) == 0 {
			behind = append(behind, r)
			add(r, 0, age, "has not issued a call yet")
			continue
		}
		last := st.Records[len(st.Records)-1]
		running := last.State == StateRunning
		switch {
		case last.Call.Seq < mySeq || (last.Call.Seq == mySeq && last.P2P && r != me):
			behind = append(behind, r)
			if running {
				add(r, 0, age, "still in %v", last.Call)
			} else {
				add(r, 0, age, "idle since %v (has not issued #%d)", last.Call, mySeq)
			}
		case running && last.Call.Seq == mySeq:
			add(r, 2, age, "wait in %v", last.Call)
		case running:
			add(r, 3, age, "are ahead in %v", last.Call)
		default:
			add(r, 3, age, "finished %v", last.Call)
		}
	}
	slices.SortStableFunc(clauses, func(a, b *clause) int { return cmp.Compare(a.order, b.order) })
	parts := make([]string, len(clauses))
	for i, cl := range clauses {
		verb := cl.text
		if len(cl.ranks) == 1 {
			// "rank 3 is still in", "rank 0 waits in"
			verb = strings.NewReplacer("still in", "is still in", "wait in", "waits in", "are ahead", "is ahead",
				"idle since", "is idle since", "does not answer", "does not answer").Replace(cl.text)
		} else {
			verb = strings.NewReplacer("still in", "are still in", "idle since", "are idle since",
				"does not answer", "do not answer", "has failed", "have failed", "has not issued", "have not issued").Replace(cl.text)
		}
		parts[i] = rankList(cl.ranks) + " " + verb
		if cl.maxAge > 0 {
			parts[i] += fmt.Sprintf(" (%.1f s)", cl.maxAge.Seconds())
		}
	}
	return behind, strings.Join(parts, "; ")
}
