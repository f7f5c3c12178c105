package comm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/collateral"
)

// Communicator is the collective contract shared by this package's CPU
// implementation and the GPU backend. Every collective returns at once with a
// Handle (it never blocks, except when QueueDepth calls are already pending)
// and is safe for concurrent use; calls complete in issue order. Buffers
// follow NCCL conventions: a call is in place when send and recv are the same
// memory (for AllGather, when send is recv's block of this rank).
type Communicator interface {
	// Rank and Size describe the group. Safe for concurrent use; do not block.
	Rank() int
	Size() int
	// AllReduce: recv = op over ranks of send. len(send) == len(recv).
	AllReduce(ctx context.Context, send, recv Buffer, op Op) Handle
	// AllGather: block r of recv (len(send) elements each) = send of rank r.
	AllGather(ctx context.Context, send, recv Buffer) Handle
	// ReduceScatter: recv = block Rank() of op over ranks of send;
	// len(send) == Size()·len(recv).
	ReduceScatter(ctx context.Context, send, recv Buffer, op Op) Handle
	// Broadcast: recv = send of root. send is read only at root.
	Broadcast(ctx context.Context, send, recv Buffer, root int) Handle
	// Reduce: recv at root = op over ranks of send; recv unused elsewhere.
	Reduce(ctx context.Context, send, recv Buffer, op Op, root int) Handle
	// AllToAll: block p of send goes to rank p, block p of recv comes from
	// rank p; len(send) == len(recv), a multiple of Size().
	AllToAll(ctx context.Context, send, recv Buffer) Handle
	// AllToAllV: sendCounts[p] elements (consecutive, in rank order) go to
	// rank p, recvCounts[p] come from p. Counts must agree pairwise.
	AllToAllV(ctx context.Context, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) Handle
	// Barrier completes on a rank once every rank has issued it.
	Barrier(ctx context.Context) Handle
	// Send and Recv exchange one buffer with one peer. Each occupies the
	// group's queue like a collective, so matching calls must be issued in a
	// compatible order on both sides, as with blocking MPI calls.
	Send(ctx context.Context, buf Buffer, peer int) Handle
	Recv(ctx context.Context, buf Buffer, peer int) Handle
	// Abort fails every pending and future call with err (ErrAborted if nil)
	// and tells the peers. Idempotent; does not wait.
	Abort(err error)
	// Close waits for issued calls to finish, says goodbye to the peers,
	// and returns once every goroutine has exited. Idempotent.
	Close() error
}

// Handle is an issued call.
type Handle interface {
	// Wait blocks until the call completes or ctx ends, and returns the
	// call's error (or ctx's). Giving up waiting does not cancel the call; the
	// call's own context does. Safe for concurrent use.
	Wait(ctx context.Context) error
	// Done reports without blocking whether the call has completed. Safe for
	// concurrent use.
	Done() bool
}

// Comm is the CPU Communicator over a Transport.
type Comm struct {
	g    Group
	gid  GroupID
	cfg  Config
	log  zerolog.Logger
	me   int
	n    int
	info []string // "rank r (world w) on host", for errors

	peers []*peer // nil at me

	// issueMu orders issuing against Close: issuers hold it shared, Close
	// exclusively, so nothing is sent on queue after it is closed.
	issueMu sync.RWMutex
	closed  bool // guarded by issueMu
	queue   chan *call

	// Issue numbers and completion (see handlePage): seqMu orders numbering
	// with queueing; issued and page are under it. completed counts the
	// calls completed (they complete in issue order); epoch is the origin
	// of handlePage.doneAt. A Wait that blocks counts itself in waiters and
	// waits for doneCh, which the next completion closes.
	seqMu     sync.Mutex
	issued    uint64
	page      *handlePage
	completed atomic.Uint64
	epoch     time.Time
	waiters   atomic.Int32
	doneMu    sync.Mutex
	doneCh    chan struct{}
	// free holds recycled call objects (see Comm.newCall).
	freeMu sync.Mutex
	free   []*call
	// running is the run token (see drain): held by the goroutine running
	// calls. wake (capacity 1) tells the worker there may be work; closing
	// is set by Close before it closes queue.
	running atomic.Bool
	// waiterRuns: the token holder is a goroutine blocked in Wait (the
	// caller's thread in libgorun), not the worker goroutine. Token holder
	// only.
	waiterRuns bool
	wake       chan struct{}
	closing    atomic.Bool
	// probing is set while the token holder waits in a Probe for a frame
	// that may never come; Close then interrupts it (probe.go).
	probing atomic.Bool

	failOnce sync.Once
	failed   chan struct{} // closed when failErr is set
	failErr  error         // written once before failed is closed

	// ctxHook is the cancellation hook of the context last issued with
	// (ctxhook.go).
	ctxHook atomic.Pointer[ctxHook]

	closeOnce    sync.Once
	closeErr     error
	wg           sync.WaitGroup
	workerExited chan struct{}
	// kicks counts the wake-ups sent to the worker (kick), for tests.
	kicks atomic.Int64
	// posts counts the messages handed to sender goroutines (post), for
	// tests. Only the call's runner (the token holder) posts, so a plain
	// count: no locked add on the large-message path; a test reads it after
	// waiting for the calls.
	posts int64
	// fusedRuns counts fused all-reduces that ran more than one call, and
	// fuseShrunk those where the ranks agreed on fewer calls than this
	// rank offered (fuse.go); like posts, for tests, read after waiting.
	fusedRuns, fuseShrunk int64

	// rec is the flight recorder; watchStop ends the stuck-call watchdog
	// (closed by Close once the worker has exited); unserve withdraws this
	// communicator's status from the transport's side channel.
	rec       *recorder
	watchStop chan struct{}
	unserve   func()
	flightDir string
	// statusT is the transport's side channel; nil without one.
	statusT StatusTransport
	// view is group rank 0's gathered view of every rank's status, which
	// it answers the other ranks' checks with (watchdog.go).
	view viewCache
	// checks, queries and queryBytes count this communicator's desync
	// checks, side-channel queries and the bytes the answers brought (the
	// check's cost, for tests).
	checks, queries, queryBytes atomic.Int64

	// crowded: every rank of the group runs on one host, which has fewer
	// online CPUs than the group has ranks (set once by New; every rank
	// computes the same, so algorithm choices that read it agree).
	crowded bool

	// Worker-only state (no lock: only the worker goroutine touches it).
	scr [4][]byte
	// rr is the reduction recvReduce hands to the link, with its operands
	// (set per receive); rrFn is c.reduceRecvd, bound once so that a
	// receive allocates no closure.
	rr struct {
		base  uintptr
		local []byte
		op    Op
		ct    DType
	}
	rrFn  func(dst, src []byte)
	slots [][]byte
	fz    fusion // fused all-reduces and the calls held for them (fuse.go)
	cseq  uint64 // collectives run so far (the flight recorder's Seq)
}

var _ Communicator = (*Comm)(nil)

// sendReq is one message for the sender goroutine, sent as frames of at
// most seg bytes and answered by one report on sendErr.
type sendReq struct {
	h       Header
	payload []byte
	seg     int
}

// peer is the state for one other rank. The worker owns seq and pending;
// the sender goroutine owns link's send side.
type peer struct {
	rank int
	link Link
	seq  uint64
	// Headers passed to the link live here rather than on the stack: a
	// pointer handed to an interface method escapes, and a heap header per
	// frame is exactly the allocation the hot path must not make.
	sendHdr Header // sender goroutine only
	inlHdr  Header // worker only: inline sends
	recvHdr Header // worker only
	// stash is a header a Probe read ahead (probe.go); stashed says it
	// waits there for the next receive. Token holder only.
	stash   Header
	stashed bool
	sendq   chan sendReq
	sendErr chan error
	pending int
}

// New connects to every other member of g over t and starts the
// communicator. It blocks until all peers have connected (bounded by ctx
// and cfg.ConnectTimeout). Every member must call New with an equal Config.
func New(ctx context.Context, g Group, t Transport, cfg Config) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if g == nil || t == nil {
		return nil, fmt.Errorf("%w: nil group or transport", ErrInvalidArgument)
	}
	n, me := g.Size(), g.Rank()
	if n < 1 || me < 0 || me >= n {
		return nil, fmt.Errorf("%w: rank %d of %d", ErrInvalidArgument, me, n)
	}
	c := &Comm{
		g: g, cfg: cfg, me: me, n: n,
		gid:    groupID(g, cfg.Tag),
		queue:  make(chan *call, cfg.QueueDepth),
		epoch:  time.Now(),
		wake:   make(chan struct{}, 1),
		failed: make(chan struct{}),

		workerExited: make(chan struct{}),
		peers:        make([]*peer, n),
		info:         make([]string, n),
		rec:          newRecorder(cfg.FlightRecords, n),
		watchStop:    make(chan struct{}),
		flightDir:    cfg.FlightDir,
	}
	if c.flightDir == "" {
		c.flightDir = os.Getenv(FlightDirEnv)
	}
	// The first calls' handle page and call objects now, not on the first
	// calls' path.
	c.page = newHandlePage(c, 0)
	c.fillFree()
	// Before any program this rank starts can inherit the report pipe.
	collateral.Claim()
	c.crowded = n > onlineCPUs()
	for r := range n {
		if g.Host(r) != g.Host(me) {
			c.crowded = false
		}
	}
	c.log = cfg.Logger.With().Int("rank", g.GlobalRank(me)).Str("host", g.Host(me)).Int("world", n).
		Str("group", fmt.Sprintf("%016x", uint64(c.gid))).Logger()
	for r := range n {
		c.info[r] = fmt.Sprintf("rank %d (world rank %d) on %s", r, g.GlobalRank(r), g.Host(r))
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	links, err := t.Connect(cctx, g, c.gid)
	if err != nil {
		return nil, fmt.Errorf("comm: connecting group of %d as rank %d: %w", n, me, err)
	}
	// Injected data-plane faults (netfault.go): links are wrapped only
	// when GORUN_NETFAULT arms one, so the hot path is untouched otherwise.
	wrapped, err := wrapNetFaults(links, g)
	if err != nil {
		for _, l := range links {
			if l != nil {
				_ = l.Close()
			}
		}
		return nil, err
	}
	links = wrapped
	for _, l := range links {
		if l != nil && l.Kind() == "shm" {
			quietSysmon() // a waiter spins on this CPU (sysmon_linux.go)
			break
		}
	}
	for r := range n {
		if r == me {
			continue
		}
		p := &peer{rank: r, link: links[r], sendq: make(chan sendReq, 64), sendErr: make(chan error, 64)}
		c.peers[r] = p
		c.wg.Go(func() { c.sender(p) })
	}
	c.rrFn = c.reduceRecvd
	c.wg.Go(c.worker)
	c.wg.Go(c.watchGroup)
	c.wg.Go(c.watchLinks)
	if st, ok := t.(StatusTransport); ok {
		c.statusT = st
		unStatus := st.ServeStatus(c.gid, c.status)
		unView := st.ServeStatus(viewGID(c.gid), func() []byte { return c.groupView(st) })
		c.unserve = func() { unView(); unStatus() }
		if c.cfg.DesyncCheckAfter > 0 {
			c.wg.Go(func() { c.watchdog(st) })
		}
	}
	register(c)
	return c, nil
}

// Rank is this process's rank in the group.
func (c *Comm) Rank() int { return c.me }

// Size is the number of ranks in the group.
func (c *Comm) Size() int { return c.n }

// Group is the membership this communicator runs over.
func (c *Comm) Group() Group { return c.g }

// LinkKinds names the medium to every peer ("" for this rank), e.g. for a
// benchmark header.
func (c *Comm) LinkKinds() []string {
	out := make([]string, c.n)
	for r, p := range c.peers {
		if p != nil {
			out[r] = p.link.Kind()
		}
	}
	return out
}

// Err returns the error that failed the communicator, or nil.
func (c *Comm) Err() error {
	select {
	case <-c.failed:
		return c.failErr
	default:
		return nil
	}
}

// sender runs one peer's asynchronous sends in post order.
func (c *Comm) sender(p *peer) {
	_, tcp := unwrapLink(p.link).(*tcpLink)
	for req := range p.sendq {
		seg := req.seg
		if tcp && c.cfg.TCPSegmentBytes > 0 {
			seg = c.cfg.TCPSegmentBytes // see Config.TCPSegmentBytes
		}
		var err error
		for off := 0; err == nil; {
			end := min(off+seg, len(req.payload))
			p.sendHdr = req.h
			p.sendHdr.Len = uint64(end - off)
			err = p.link.Send(&p.sendHdr, req.payload[off:end])
			if off = end; off == len(req.payload) {
				break
			}
		}
		p.sendErr <- err
	}
}

// watchGroup turns the rendezvous' failure event into an abort.
func (c *Comm) watchGroup() {
	select {
	case <-c.g.Failed():
		err := c.g.Err()
		if err == nil {
			err = errors.New("group failed")
		}
		c.fail(fmt.Errorf("%w: %w", ErrPeerLost, err))
	case <-c.failed:
	}
}

// fail records err as the communicator's failure (first one wins), tells the
// peers and closes the links so that whatever is blocked returns.
func (c *Comm) fail(err error) {
	c.failOnce.Do(func() {
		c.failErr = err
		close(c.failed)
		c.log.Warn().Err(err).Msg("communicator failed")
		c.tellCollateral(err)
		var class uint64
		switch {
		case errors.Is(err, ErrDesync):
			class = 1
		case errors.Is(err, ErrPeerLost):
			class = 2
		case errors.Is(err, ErrInvalidArgument):
			class = 3
		case errors.Is(err, ErrStalled):
			class = 4
		}
		text := []byte(err.Error())
		if len(text) > maxAbortText {
			text = text[:maxAbortText]
		}
		// A desync or stall travels with its fields too (after a NUL), so
		// every peer can report the same *DesyncError (turned to its side)
		// or *StallError.
		var de *DesyncError
		var se *StallError
		var fields any
		switch {
		case errors.As(err, &de):
			fields = de
		case errors.As(err, &se):
			fields = se
		}
		if fields != nil {
			if j, jerr := json.Marshal(fields); jerr == nil && len(text)+1+len(j) <= maxAbortText {
				text = append(append(text, 0), j...)
			}
		}
		// Tell the peers in parallel, each bounded by AbortTimeout, then
		// close every link. A peer stuck in a full send buffer cannot hold us.
		var wg sync.WaitGroup
		for _, p := range c.peers {
			if p == nil {
				continue
			}
			wg.Go(func() {
				done := make(chan struct{})
				go func() { // owned: waited for below, or unblocked by Close
					defer close(done)
					h := Header{Frame: frameAbort, Group: c.gid, Aux: class, Len: uint64(len(text))}
					_ = p.link.Send(&h, text)
				}()
				select {
				case <-done:
				case <-time.After(c.cfg.AbortTimeout):
				}
				_ = p.link.Close()
				<-done
			})
		}
		wg.Wait()
		c.dumpFlight("failed: " + err.Error())
	})
}

// tellCollateral tells the rank's supervisor, when err is another rank's
// doing (a peer lost, closed or aborted), that this rank fails as a
// consequence: gorun then names the first cause, not whichever rank exits
// first (internal/collateral). It runs before the peers are told and
// before the failed call returns, so the report precedes any exit it
// explains.
func (c *Comm) tellCollateral(err error) {
	var pe *PeerError
	var lost interface{ LostWorldRank() int } // rendezvous.LostError
	var fce *FrameCheckError                  // the link from fce.From corrupted a frame
	var de *DesyncError
	switch {
	case errors.As(err, &de):
		collateral.Tell(collateral.Report{Rank: c.g.GlobalRank(c.me), Blame: de.minority(), Why: err.Error(),
			Relay: de.ReportedBy != "", Desync: true})
	case errors.As(err, &fce):
		collateral.Tell(collateral.Report{Rank: c.g.GlobalRank(c.me), Blame: fce.From, Why: err.Error()})
	case errors.As(err, &pe):
		collateral.Tell(collateral.Report{Rank: c.g.GlobalRank(c.me), Blame: pe.WorldRank, Why: err.Error(), Relay: pe.aborted()})
	case errors.As(err, &lost):
		collateral.Tell(collateral.Report{Rank: c.g.GlobalRank(c.me), Blame: lost.LostWorldRank(), Why: err.Error()})
	case errors.Is(err, ErrPeerLost):
		collateral.Tell(collateral.Report{Rank: c.g.GlobalRank(c.me), Blame: -1, Why: err.Error()})
	}
}

// Abort fails every pending and future call with err and tells the peers.
// It returns within Config.AbortTimeout.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = ErrAborted
	} else if !errors.Is(err, ErrAborted) {
		err = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	c.fail(err)
}

// Close waits for issued calls, says goodbye and stops every goroutine. A
// call that cannot complete (a peer that never issues it) holds Close; call
// Abort first to give up on pending calls. A Probe still waiting is the
// exception: Close ends it with ErrClosed (no message is lost by that).
func (c *Comm) Close() error {
	c.closeOnce.Do(func() {
		c.issueMu.Lock()
		c.closed = true
		c.closing.Store(true)
		close(c.queue)
		c.issueMu.Unlock()
		c.kick()
		if c.probing.Load() {
			c.interruptProbe()
		}
		<-c.workerExited
		c.dropHook()
		close(c.watchStop)
		if c.Err() == nil {
			c.sayBye()
		}
		c.failOnce.Do(func() { c.failErr = ErrClosed; close(c.failed) })
		for _, p := range c.peers {
			if p != nil {
				close(p.sendq)
				_ = p.link.Close()
			}
		}
		c.wg.Wait()
		if c.unserve != nil {
			if errors.Is(c.failErr, ErrClosed) {
				c.unserve()
			} else {
				// A failed communicator keeps answering status queries for
				// AbortTimeout: a peer whose link it reset before the
				// abort got through asks it why (askWhy in worker.go),
				// and a program closes right after the error.
				time.AfterFunc(c.cfg.AbortTimeout, c.unserve)
			}
		}
		unregister(c)
		if err := c.failErr; !errors.Is(err, ErrClosed) {
			c.closeErr = err
		}
	})
	return c.closeErr
}
