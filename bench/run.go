package bench

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// RankInfo is one line of the header: where a rank runs and over what it
// reaches its peers.
type RankInfo struct {
	Rank      int    `json:"rank"`
	Host      string `json:"host"`
	PID       int    `json:"pid"`
	Transport string `json:"transport"` // "shm", "tcp", "shm+tcp", "self" (one rank), "mem" (tests), "nccl"
	// Device is the GPU with --device cuda, as nccl-tests prints it: the
	// ordinal this rank sees and the device's name.
	Device string `json:"device,omitempty"`
}

// linkKinder is implemented by comm.Comm: the medium to every peer.
type linkKinder interface{ LinkKinds() []string }

// runner is the state of one rank's sweep.
type runner struct {
	cfg   *Config
	c     comm.Communicator // the communicator measured
	ctl   comm.Communicator // host-memory reductions of times and wrong counts (c itself on CPUs)
	n, me int
	es    int
	io    elems
	gen   valueGen

	send, recv []byte // largest buffers of the sweep; calls use prefixes

	// gpu holds, with --device cuda, the device twins of send and recv
	// (same layout; the host ones are then staging for the check) and the
	// device-side check's buffers (gpu.go). Nil on CPUs.
	gpu *gpuBuffers

	// corrupt, when set (tests only), damages an output after a checked
	// call and before it is verified, to prove the checker catches it.
	corrupt func(rank int, inPlace bool, out []byte)

	// views are the host Buffers of the last two slices issued (send and
	// receive of the row being timed), reused so that the timed loop does
	// not allocate two per call: fresh heap costs the latency path a page
	// fault every few dozen calls until the first garbage collection.
	views    [2]hostView
	nextView int
}

// hostView is a Buffer over b.
type hostView struct {
	b   []byte
	buf comm.Buffer
}

// Run measures cfg's sweep on this rank of c and returns the results, the
// same on every rank (times and wrong counts are reduced over ranks). Rank 0
// writes the table to cfg.Out as rows complete. ranks describes every rank
// for the header (index = rank); its Transport fields are filled in here.
//
// Every rank of c must call Run with an equal Config. Run blocks until the
// sweep ends. It returns a *WrongError when the check found wrong elements
// (after the whole table is written), ErrNoShm when TransportShm was
// required and not every link is shared memory, and comm's error when a
// collective fails (a lost peer, a cancelled ctx).
func Run(ctx context.Context, cfg Config, c comm.Communicator, ranks []RankInfo) (*Report, error) {
	return run(ctx, cfg, c, c, ranks, nil)
}

// run is Run with a separate control communicator ctl (host memory) for the
// reductions of times and wrong counts, which a GPU communicator cannot
// take, and the checker's test hook.
func run(ctx context.Context, cfg Config, c, ctl comm.Communicator, ranks []RankInfo, corrupt func(int, bool, []byte)) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n, me := c.Size(), c.Rank()
	if cfg.Op.Rooted() && cfg.Root >= n {
		return nil, &UsageError{Problem: fmt.Sprintf("-r %d: root outside the %d ranks", cfg.Root, n)}
	}
	r := &runner{cfg: &cfg, c: c, ctl: ctl, n: n, me: me, es: cfg.DType.Size(), io: elemsOf(cfg.DType),
		gen: newValueGen(&cfg, n), corrupt: corrupt}

	kinds, err := r.transports(ctx)
	if err != nil {
		return nil, err
	}
	rep := newReport(&cfg, n, ranks, kinds)
	if cfg.Transport == TransportShm && n > 1 {
		for rk, k := range kinds {
			if k != "shm" {
				return rep, fmt.Errorf("%w: rank %d reaches its peers over %s (shared memory needs every rank on one host, and comm support)", ErrNoShm, rk, k)
			}
		}
	}

	sizes := cfg.Sizes()
	var maxSend, maxBuf int64
	for _, s := range sizes {
		sh := shapeFor(cfg.Op, s, r.es, n)
		maxSend = max(maxSend, int64(sh.sendCount*r.es))
		maxBuf = max(maxBuf, sh.bytes(r.es))
	}
	r.send, r.recv = alignedBytes(maxSend), alignedBytes(maxBuf)
	// With a GPU communicator: device buffers, and each rank's GPU in
	// the header.
	release, err := r.startGPU(ctx, rep, maxSend, maxBuf)
	if err != nil {
		return rep, err
	}
	defer release()

	out := cfg.Out
	if me != 0 {
		out = nil
	}
	if out != nil {
		writeHeader(out, rep)
	}
	var wrongRows int
	for i, s := range sizes {
		if me == 0 && cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "\r\033[Kgorun bench: %s %s, size %d of %d (%d left)", cfg.Op, FormatSize(s), i+1, len(sizes), len(sizes)-i-1)
		}
		row, err := r.row(ctx, s)
		if err != nil {
			if me == 0 && cfg.Progress != nil {
				fmt.Fprint(cfg.Progress, "\r\033[K")
			}
			return rep, err
		}
		rep.add(row)
		if row.wrong() > 0 {
			wrongRows++
		}
		if out != nil {
			writeRow(out, &row)
		}
	}
	if me == 0 && cfg.Progress != nil {
		fmt.Fprint(cfg.Progress, "\r\033[K")
	}
	rep.finish()
	if out != nil {
		writeFooter(out, rep)
	}
	if rep.Wrong > 0 {
		return rep, &WrongError{Wrong: rep.Wrong, Rows: wrongRows}
	}
	return rep, nil
}

// transports gathers every rank's link kinds, so rank 0 can print them and
// every rank can agree on failing a --transport shm run.
func (r *runner) transports(ctx context.Context) ([]string, error) {
	const (
		tcp = 1 << iota
		shm
		other
	)
	if r.cfg.Device == DeviceCUDA {
		out := make([]string, r.n)
		for i := range out {
			out[i] = "nccl"
		}
		return out, nil
	}
	var mine uint8
	if lk, ok := r.c.(linkKinder); ok {
		for _, k := range lk.LinkKinds() {
			switch k {
			case "":
			case "tcp":
				mine |= tcp
			case "shm":
				mine |= shm
			default:
				mine |= other
			}
		}
	}
	all := make([]uint8, r.n)
	if err := r.ctl.AllGather(ctx, comm.Uint8s([]uint8{mine}), comm.Uint8s(all)).Wait(ctx); err != nil {
		return nil, err
	}
	out := make([]string, r.n)
	for i, m := range all {
		var parts []string
		if m&shm != 0 {
			parts = append(parts, "shm")
		}
		if m&tcp != 0 {
			parts = append(parts, "tcp")
		}
		if m&other != 0 {
			parts = append(parts, "mem")
		}
		if len(parts) == 0 {
			parts = []string{"self"}
		}
		out[i] = strings.Join(parts, "+")
	}
	return out, nil
}

// buffers returns the send and receive buffers of one call. In place
// follows NCCL: one buffer, with all-gather's input being this rank's block
// of the output and reduce-scatter's output this rank's block of the input.
// ok is false when the operation has no in-place form here (send/recv, whose
// receive would overwrite the send on ranks that receive first).
func (r *runner) buffers(sh shape, inPlace bool) (send, recv []byte, ok bool) {
	es := r.es
	if !inPlace {
		return r.send[:sh.sendCount*es], r.recv[:sh.recvCount*es], true
	}
	switch r.cfg.Op {
	case SendRecv, Barrier:
		return nil, nil, false
	case AllGather:
		all := r.recv[:sh.recvCount*es]
		k := sh.sendCount * es
		return all[r.me*k : (r.me+1)*k], all, true
	case ReduceScatter:
		all := r.recv[:sh.sendCount*es]
		k := sh.recvCount * es
		return all, all[r.me*k : (r.me+1)*k], true
	}
	b := r.recv[:sh.sendCount*es]
	return b, b, true
}

// doneHandle is a completed call, for work that needs no communication.
type doneHandle struct{}

func (doneHandle) Wait(context.Context) error { return nil }
func (doneHandle) Done() bool                 { return true }

// issue starts one collective and returns the handle that completes last.
func (r *runner) issue(ctx context.Context, send, recv []byte) comm.Handle {
	sb, rb := r.view(send), r.view(recv)
	c, cfg := r.c, r.cfg
	switch cfg.Op {
	case AllReduce:
		return c.AllReduce(ctx, sb, rb, cfg.RedOp)
	case AllGather:
		return c.AllGather(ctx, sb, rb)
	case ReduceScatter:
		return c.ReduceScatter(ctx, sb, rb, cfg.RedOp)
	case Broadcast:
		return c.Broadcast(ctx, sb, rb, cfg.Root)
	case Reduce:
		return c.Reduce(ctx, sb, rb, cfg.RedOp, cfg.Root)
	case AllToAll:
		return c.AllToAll(ctx, sb, rb)
	case SendRecv:
		if h := r.gpuSendRecv(ctx, sb, rb); h != nil {
			return h
		}
		// Each rank sends to the next and receives from the previous, as
		// nccl-tests' sendrecv. comm's Send and Recv hold the queue like
		// blocking MPI calls, so even ranks send first and odd ranks
		// receive first: no cycle of waiting senders. One rank sends to
		// itself, which is a copy.
		if r.n == 1 {
			copy(recv, send)
			return doneHandle{}
		}
		right, left := (r.me+1)%r.n, (r.me+r.n-1)%r.n
		if r.me%2 == 0 {
			c.Send(ctx, sb, right)
			return c.Recv(ctx, rb, left)
		}
		c.Recv(ctx, rb, left)
		return c.Send(ctx, sb, right)
	}
	return c.Barrier(ctx)
}

// timed runs Warmup then Iters calls and returns the mean seconds per call.
//
// Every iteration looks at ctx and at the call it just issued: calls of a
// healthy world complete without consulting the context, and a failed
// communicator fails each new call at once, so without these checks a
// SIGTERMed rank (ctx cancelled) or a rank whose peer was lost would issue
// every remaining iteration of the sweep before noticing.
func (r *runner) timed(ctx context.Context, send, recv []byte) (float64, error) {
	// Handles are waited for in batches of at most maxOutstanding, so a
	// sweep of a billion iterations does not hold a billion handles.
	const maxOutstanding = 1 << 14
	hs := make([]comm.Handle, 0, min(max(r.cfg.Warmup, r.cfg.Iters), maxOutstanding))
	waitAll := func() error {
		for _, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return err
			}
		}
		hs = hs[:0]
		return nil
	}
	// issueNext issues one call, after checking that the sweep should go
	// on, and waits for the batch when it is full.
	issueNext := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		h := r.issue(ctx, send, recv)
		hs = append(hs, h)
		if h.Done() || len(hs) == maxOutstanding {
			// A call that completed at issue may have failed: say so now.
			return waitAll()
		}
		return nil
	}
	for range r.cfg.Warmup {
		if err := issueNext(); err != nil {
			return 0, err
		}
	}
	if err := waitAll(); err != nil {
		return 0, err
	}
	// Start together: without the barrier, a rank that finished warming up
	// early would count its wait for the others as time of the first call.
	if err := r.c.Barrier(ctx).Wait(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	if r.cfg.Blocking {
		wctx := comm.IssuerWaits(ctx)
		for range r.cfg.Iters {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if err := r.issue(wctx, send, recv).Wait(wctx); err != nil {
				return 0, err
			}
		}
		return time.Since(start).Seconds() / float64(r.cfg.Iters), nil
	}
	for range r.cfg.Iters {
		if err := issueNext(); err != nil {
			return 0, err
		}
	}
	if err := waitAll(); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds() / float64(r.cfg.Iters), nil
}

// row measures one size: out-of-place then in-place timing, then one checked
// call of each, then the reductions of times and wrong counts over ranks.
func (r *runner) row(ctx context.Context, size int64) (Row, error) {
	cfg := r.cfg
	sh := shapeFor(cfg.Op, size, r.es, r.n)
	row := Row{
		Bytes: sh.bytes(r.es), Count: int64(sh.paramCount),
		Type: ncclTypeName(cfg.DType), RedOp: "none", Root: -1,
	}
	if cfg.Op.Reduces() {
		row.RedOp = cfg.RedOp.String()
	}
	if cfg.Op.Rooted() {
		row.Root = cfg.Root
	}
	if cfg.Op == Barrier {
		row.Type = "none"
	}

	times := []float64{0, 0}
	wrong := []int64{-1, -1}
	var has [2]bool
	for p, inPlace := range []bool{false, true} {
		send, recv, ok := r.buffers(sh, inPlace)
		if !ok {
			continue
		}
		has[p] = true
		t, err := r.timed(ctx, send, recv)
		if err != nil {
			return row, err
		}
		times[p] = t
		if cfg.Check && cfg.Op != Barrier {
			w, err := r.checked(ctx, sh, send, recv, inPlace)
			if err != nil {
				return row, err
			}
			wrong[p] = w
		}
	}
	if err := r.ctl.AllReduce(ctx, comm.Float64s(times), comm.Float64s(times), comm.Max).Wait(ctx); err != nil {
		return row, fmt.Errorf("bench: reducing times: %w", err)
	}
	if cfg.Check && cfg.Op != Barrier {
		if err := r.ctl.AllReduce(ctx, comm.Int64s(wrong), comm.Int64s(wrong), comm.Sum).Wait(ctx); err != nil {
			return row, fmt.Errorf("bench: reducing wrong counts: %w", err)
		}
	}
	factor := cfg.Op.BusFactor(r.n)
	for p := range 2 {
		if !has[p] {
			continue
		}
		m := &Measure{TimeUs: times[p] * 1e6, Wrong: wrong[p]}
		if times[p] > 0 {
			m.AlgBW = float64(sh.algBytes) / times[p] / 1e9
			m.BusBW = m.AlgBW * factor
		}
		if p == 0 {
			row.OutOfPlace = m
		} else {
			row.InPlace = m
		}
	}
	return row, nil
}

// checked fills the inputs with the check values, runs the call once and
// counts this rank's wrong output elements.
func (r *runner) checked(ctx context.Context, sh shape, send, recv []byte, inPlace bool) (int64, error) {
	cfg, me, n, io := r.cfg, r.me, r.n, r.io
	for i := range recv {
		recv[i] = sentinelByte
	}
	// The input: rank me's values at every index the collective reads.
	for j := range sh.sendCount {
		io.set(send, j, r.gen.at(me, j))
	}
	if r.gpu != nil {
		// The host buffers are staging with the device buffers' layout:
		// the output (sentinels, and the input when in place) then the
		// input go up.
		if err := r.upload(recv); err != nil {
			return 0, err
		}
		if err := r.upload(send); err != nil {
			return 0, err
		}
	}
	if err := r.issue(ctx, send, recv).Wait(ctx); err != nil {
		return 0, err
	}
	if r.corrupt != nil {
		if err := r.corruptOutput(me, inPlace, recv); err != nil {
			return 0, err
		}
	}
	per := sh.paramCount
	var expect func(j int) float64
	switch cfg.Op {
	case AllReduce:
		expect = func(j int) float64 { return r.gen.reduced(cfg.DType, j) }
	case Reduce:
		if me != cfg.Root {
			return 0, nil // the output is only defined at the root
		}
		expect = func(j int) float64 { return r.gen.reduced(cfg.DType, j) }
	case ReduceScatter:
		expect = func(j int) float64 { return r.gen.reduced(cfg.DType, me*per+j) }
	case AllGather:
		expect = func(j int) float64 { return quantize(cfg.DType, r.gen.at(j/per, j%per)) }
	case Broadcast:
		expect = func(j int) float64 { return quantize(cfg.DType, r.gen.at(cfg.Root, j)) }
	case AllToAll:
		expect = func(j int) float64 { return quantize(cfg.DType, r.gen.at(j/per, me*per+j%per)) }
	case SendRecv:
		left := (me + n - 1) % n
		expect = func(j int) float64 { return quantize(cfg.DType, r.gen.at(left, j)) }
	default:
		return 0, nil
	}
	if r.gpu != nil {
		return r.countWrongOnDevice(recv, sh.recvCount, expect)
	}
	var wrong int64
	for j := range sh.recvCount {
		if io.get(recv, j) != expect(j) {
			wrong++
		}
	}
	return wrong, nil
}

// ncclTypeName is nccl-tests' name of a type, for the table.
func ncclTypeName(dt comm.DType) string {
	switch dt {
	case comm.Float32:
		return "float"
	case comm.Float64:
		return "double"
	case comm.Float16:
		return "half"
	}
	return dt.String()
}

// ParseDType accepts nccl-tests' names (float, double, half, bfloat16,
// int32, int64, uint8) and comm's (float32, bf16, fp16...).
func ParseDType(s string) (comm.DType, error) {
	dt, err := comm.ParseDType(strings.ToLower(s))
	if err != nil {
		return 0, &UsageError{Problem: fmt.Sprintf("-d %q: expected float, double, half, bfloat16, int32, int64 or uint8", s)}
	}
	return dt, nil
}

// ParseRedOp accepts sum, prod, min, max and avg.
func ParseRedOp(s string) (comm.Op, error) {
	op, err := comm.ParseOp(strings.ToLower(s))
	if err != nil {
		return 0, &UsageError{Problem: fmt.Sprintf("-o %q: expected sum, prod, min, max or avg", s)}
	}
	return op, nil
}

// view is the Buffer a call uses for b, a part of r.send or r.recv: b
// itself in host memory, or the same part of the device twin.
func (r *runner) view(b []byte) comm.Buffer {
	if r.gpu != nil {
		return r.gpuView(b)
	}
	for _, v := range r.views {
		if v.buf != nil && len(v.b) == len(b) && unsafe.SliceData(v.b) == unsafe.SliceData(b) {
			return v.buf
		}
	}
	hb, _ := comm.Bytes(r.cfg.DType, b)
	r.views[r.nextView] = hostView{b: b, buf: hb}
	r.nextView ^= 1
	return hb
}

// corruptOutput applies the test hook to the output, wherever it lives.
func (r *runner) corruptOutput(me int, inPlace bool, recv []byte) error {
	if r.gpu == nil {
		r.corrupt(me, inPlace, recv)
		return nil
	}
	return r.gpuCorrupt(me, inPlace, recv)
}
