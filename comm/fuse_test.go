package comm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
)

// Fusion on the fly: calls queued behind one another run as one fused
// message, and however the ranks' timing differs (what each had queued
// when), every rank runs the same calls together and gets the same bits as
// without fusion.

// fcall is one call of a fusion test script. An all-reduce either has its
// own send and receive buffers or (onto >= 0) runs in place on the receive
// buffer of an earlier call, which it must then read after that call wrote
// it.
type fcall struct {
	kind  comm.Kind // KindAllReduce or KindBroadcast
	dt    comm.DType
	op    comm.Op
	count int
	onto  int
	// parts, when set, make it one AllReduceCoalesced of vectors of these
	// counts (count is their sum); with chain, vector 1 runs in place on
	// vector 0's result.
	parts []int
	chain bool
}

func (fc fcall) String() string {
	return fmt.Sprintf("%v(%v %v, %d, onto %d, parts %v chain %v)", fc.kind, fc.dt, fc.op, fc.count, fc.onto, fc.parts, fc.chain)
}

// fuseScript draws a script: runs of small all-reduces of one dtype and op
// (the case fusion is for), broken by changes of dtype or op, in-place
// chains, broadcasts, all-reduces too large to fuse, and empty ones.
func fuseScript(rng *rand.Rand, calls int) []fcall {
	dts := []comm.DType{comm.Float32, comm.Float64, comm.BFloat16, comm.Float16, comm.Int32, comm.Uint8}
	var out []fcall
	dt, op := comm.Float32, comm.Sum
	for i := range calls {
		if rng.IntN(6) == 0 {
			dt = dts[rng.IntN(len(dts))]
		}
		if rng.IntN(6) == 0 {
			op = comm.Ops[rng.IntN(len(comm.Ops))]
		}
		fc := fcall{kind: comm.KindAllReduce, dt: dt, op: op, count: 1 + rng.IntN(300), onto: -1}
		switch x := rng.IntN(20); {
		case x == 0:
			fc.kind, fc.op = comm.KindBroadcast, 0
		case x == 1:
			fc.count = 20000 // 80 KiB of float32: above FuseBytes
		case x == 2:
			fc.count = 0
		case x == 3 || x == 4:
			// Coalesced: a few vectors, sometimes one too large to
			// fuse, sometimes chained.
			fc.count = 0
			for range 1 + rng.IntN(12) {
				c := 1 + rng.IntN(200)
				if rng.IntN(30) == 0 {
					c = 20000
				}
				fc.parts = append(fc.parts, c)
				fc.count += c
			}
			if len(fc.parts) > 1 && fc.parts[0] == fc.parts[1] || len(fc.parts) > 1 && rng.IntN(4) == 0 {
				fc.parts[1] = fc.parts[0]
				fc.count = 0
				for _, c := range fc.parts {
					fc.count += c
				}
				fc.chain = true
			}
		case x < 8 && i > 0:
			// In place on an earlier all-reduce's result (same dtype).
			for j := i - 1; j >= 0 && j >= i-4; j-- {
				if p := out[j]; p.kind == comm.KindAllReduce && p.dt == dt {
					fc.onto, fc.count = j, p.count
					break
				}
			}
		}
		out = append(out, fc)
	}
	return out
}

// fuseInput fills b (count elements of dt) with values of rank r for call
// i: floats spread over magnitudes so that the order of a sum shows in
// its bits, small integers so that products stay defined.
func fuseInput(dt comm.DType, b []byte, seed uint64, i, r int) {
	rng := rand.New(rand.NewPCG(seed, uint64(i)<<8|uint64(r)))
	es := dt.Size()
	for k := 0; k < len(b)/es; k++ {
		f := rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3))
		e := b[k*es : (k+1)*es]
		switch dt {
		case comm.Float32:
			binary.LittleEndian.PutUint32(e, math.Float32bits(float32(f)))
		case comm.Float64:
			binary.LittleEndian.PutUint64(e, math.Float64bits(f))
		case comm.BFloat16:
			binary.LittleEndian.PutUint16(e, uint16(comm.BF16(float32(f))))
		case comm.Float16:
			binary.LittleEndian.PutUint16(e, uint16(comm.F16(float32(f)/1000)))
		case comm.Int32:
			binary.LittleEndian.PutUint32(e, uint32(int32(rng.IntN(7)-3)))
		case comm.Uint8:
			e[0] = uint8(rng.IntN(4))
		}
	}
}

// How a rank issues the script.
const (
	patLockstep = iota // issue and wait each call: every call alone
	patBurst           // issue all (IssuerWaits: nothing runs), then wait: offers as long as allowed
	patEager           // issue all at once to the worker, then wait
	patJitter          // issue with random yields, pauses and waits between calls
	patCount
)

var patNames = [...]string{"lockstep", "burst", "eager", "jitter"}

// runScript runs script on every rank of comms, rank r issuing it the way
// pats[r] says, and returns every rank's receive buffers in call order.
func runScript(t *testing.T, comms []*comm.Comm, script []fcall, seed uint64, pats []int) [][][]byte {
	t.Helper()
	n := len(comms)
	out := make([][][]byte, n)
	errs := onEach(t, n, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		rng := rand.New(rand.NewPCG(seed^0x5eed, uint64(r)))
		recv := make([][]byte, len(script))
		out[r] = recv
		var hs []comm.Handle
		issueCtx := context.Background()
		if pats[r] == patBurst {
			issueCtx = comm.IssuerWaits(ctx)
		}
		for i, fc := range script {
			size := fc.count * fc.dt.Size()
			var send []byte
			if fc.onto >= 0 {
				recv[i] = recv[fc.onto]
				send = recv[i]
			} else {
				send, recv[i] = make([]byte, size), make([]byte, size)
				fuseInput(fc.dt, send, seed, i, r)
			}
			sb, err := comm.Bytes(fc.dt, send)
			if err != nil {
				return err
			}
			rb, err := comm.Bytes(fc.dt, recv[i])
			if err != nil {
				return err
			}
			var h comm.Handle
			if fc.parts != nil {
				var sends, recvs []comm.Buffer
				off := 0
				for j, c := range fc.parts {
					s, r := send[off:off+c*fc.dt.Size()], recv[i][off:off+c*fc.dt.Size()]
					if j == 1 && fc.chain {
						s = recv[i][:c*fc.dt.Size()]
					}
					off += c * fc.dt.Size()
					sb, _ := comm.Bytes(fc.dt, s)
					rb, _ := comm.Bytes(fc.dt, r)
					sends, recvs = append(sends, sb), append(recvs, rb)
				}
				h = comms[r].AllReduceCoalesced(issueCtx, sends, recvs, fc.op)
			} else if fc.kind == comm.KindBroadcast {
				h = comms[r].Broadcast(issueCtx, sb, rb, i%n)
			} else {
				h = comms[r].AllReduce(issueCtx, sb, rb, fc.op)
			}
			hs = append(hs, h)
			switch pats[r] {
			case patLockstep:
				if err := h.Wait(ctx); err != nil {
					return fmt.Errorf("call %d %v: %w", i, fc, err)
				}
			case patJitter:
				switch rng.IntN(8) {
				case 0:
					runtime.Gosched()
				case 1:
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				case 2:
					if err := h.Wait(ctx); err != nil {
						return fmt.Errorf("call %d %v: %w", i, fc, err)
					}
				}
			}
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return fmt.Errorf("call %d %v: %w", i, script[i], err)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d (%s): %v", r, patNames[pats[r]], err)
		}
	}
	return out
}

// checkFusedRecords checks a rank's flight records: calls in issue order,
// and the calls of each fused message (the records that started with it)
// all all-reduces of one dtype and op.
func checkFusedRecords(t *testing.T, r int, recs []comm.FlightRecord) {
	t.Helper()
	for i, rec := range recs {
		if i > 0 && rec.Call.Seq != recs[i-1].Call.Seq+1 {
			t.Fatalf("rank %d: record %d is call #%d after #%d", r, i, rec.Call.Seq, recs[i-1].Call.Seq)
		}
		if i > 0 && rec.Fused > 1 && rec.Started.Equal(recs[i-1].Started) {
			o := recs[i-1]
			if o.Call.Kind != comm.KindAllReduce || rec.Call.Kind != comm.KindAllReduce || o.Call.DType != rec.Call.DType || o.Call.Op != rec.Call.Op {
				t.Fatalf("rank %d: a fused message mixes %v and %v", r, o.Call, rec.Call)
			}
		}
	}
}

// Timing-randomised: every rank issues the same script in its own way
// (each call alone, all queued before any runs, to the worker as fast as
// it can, or with random pauses), so the ranks offer different numbers of
// calls to each fused message; every rank must get bitwise what it gets
// with fusion off. Over the in-memory network at 2, 4, 5 and 6 ranks (5 and 6
// exercise the ranks that recursive doubling absorbs), and over shared
// memory and TCP.
func TestFusionMatchesUnfusedBitwise(t *testing.T) {
	type setup struct {
		name string
		n    int
		net  string // "mem", "shm", "tcp"
	}
	setups := []setup{{"mem2", 2, "mem"}, {"mem4", 4, "mem"}, {"mem5", 5, "mem"}, {"mem6", 6, "mem"}, {"shm4", 4, "shm"}, {"tcp2", 2, "tcp"}}
	trials := 4
	if testing.Short() {
		trials = 2
	}
	var fusedAll, shrunkAll int64
	for _, su := range setups {
		t.Run(su.name, func(t *testing.T) {
			mk := func(fuse int) []*comm.Comm {
				cfg := comm.LocalConfig()
				cfg.FuseBytes = fuse
				cfg.FlightRecords = 4096
				if su.n&(su.n-1) != 0 {
					// Off a crowded host the cost model sends all but the
					// tiniest all-reduces of a group of 5 or 6 over the
					// ring, which does not fuse; a dear message makes
					// recursive doubling (and so fusion, with ranks
					// absorbed by others) the choice.
					cfg.LatencyNs = 1e6
				}
				switch su.net {
				case "mem":
					return newMemJob(t, su.n, cfg).comms
				default:
					return newNetJob(t, su.n, cfg, su.net == "tcp").comms
				}
			}
			plain, fused := mk(0), mk(comm.DefaultConfig().FuseBytes)
			for trial := range trials {
				seed := uint64(trial*100 + su.n)
				rng := rand.New(rand.NewPCG(seed, 1))
				script := fuseScript(rng, 120)
				pats := make([]int, su.n)
				for r := range pats {
					pats[r] = rng.IntN(patCount)
				}
				if trial == 0 {
					// One rank offers everything, the others one call at
					// a time: every offer but the lone ones is cut short.
					for r := range pats {
						pats[r] = patLockstep
					}
					pats[0] = patBurst
				}
				want := runScript(t, plain, script, seed, make([]int, su.n))
				got := runScript(t, fused, script, seed, pats)
				for r := range got {
					for i := range script {
						if !bytes.Equal(got[r][i], want[r][i]) {
							t.Fatalf("trial %d rank %d (%s): call %d %v differs from unfused:\n got %x\nwant %x",
								trial, r, patNames[pats[r]], i, script[i], head(got[r][i]), head(want[r][i]))
						}
					}
				}
			}
			for r, c := range fused {
				checkFusedRecords(t, r, c.FlightRecords())
				f, s := comm.FuseCounts(c)
				fusedAll += f
				shrunkAll += s
			}
			for r, c := range plain {
				if f, _ := comm.FuseCounts(c); f != 0 {
					t.Fatalf("rank %d fused %d messages with FuseBytes 0", r, f)
				}
			}
		})
	}
	// The controls: the runs fused, and ranks disagreed on offers, or the
	// comparison above proved nothing about fusion.
	if fusedAll == 0 || shrunkAll == 0 {
		t.Fatalf("fused messages %d, offers cut short %d: the scripts did not exercise fusion", fusedAll, shrunkAll)
	}
	t.Logf("fused messages %d, offers cut short %d", fusedAll, shrunkAll)
}

// A call queued with nothing behind it runs at once: each rank issues one
// all-reduce and waits for it, and issues the next only once it completed.
// Were fusion to hold a call for company, no rank would ever issue the
// call it waits for, and this would hang (and fail on the hang guard)
// instead of passing. No timer decides the outcome. Also checks that the
// frames of a lone fusable call are exactly those of an unfused one: a
// rank with fusion off runs alongside ranks with it on.
func TestFusionNeverHoldsALoneCall(t *testing.T) {
	for _, n := range []int{2, 3} {
		for _, mixed := range []bool{false, true} {
			cfg := comm.LocalConfig()
			// Mixed: rank 0 has fusion off.
			j := newMixedMemJob(t, n, func(r int) comm.Config {
				c := cfg
				if mixed && r == 0 {
					c.FuseBytes = 0
				}
				return c
			})
			errs := onEach(t, n, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				for i := range 20 {
					buf := []float32{float32(r + i)}
					if err := j.comms[r].AllReduce(context.Background(), comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx); err != nil {
						return err
					}
					want := float32(n*(n-1)/2 + n*i)
					if buf[0] != want {
						return fmt.Errorf("call %d: %v, want %v", i, buf[0], want)
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("n=%d mixed=%v rank %d: %v", n, mixed, r, err)
				}
			}
			for r, c := range j.comms {
				for _, rec := range c.FlightRecords() {
					if rec.Fused != 0 {
						t.Fatalf("n=%d rank %d: lone call %v ran fused with %d", n, r, rec.Call, rec.Fused)
					}
				}
			}
		}
	}
}

// newMixedMemJob is newMemJob with a Config per rank.
func newMixedMemJob(t *testing.T, n int, cfgOf func(r int) comm.Config) *memJob {
	t.Helper()
	j := newMemJob(t, 0, comm.LocalConfig())
	for r := range n {
		j.addrs = append(j.addrs, fmt.Sprintf("mem%d:1", r))
	}
	j.comms = make([]*comm.Comm, n)
	errs := onEach(t, n, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		cfg := cfgOf(r)
		cfg.Logger = testLogger(t)
		c, err := comm.New(ctx, commtest.NewStaticGroup(r, j.addrs, nil), j.nw.Endpoint(j.addrs[r]), cfg)
		j.comms[r] = c
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return j
}

// Calls of different kinds, dtypes or ops never share a message, and
// calls run in issue order: every rank queues a mix before any runs, so
// each offers as much as the rule allows.
func TestFusionNeverMixes(t *testing.T) {
	const n = 4
	cfg := comm.LocalConfig()
	cfg.FlightRecords = 1024
	j := newMemJob(t, n, cfg)
	type spec struct {
		kind comm.Kind
		dt   comm.DType
		op   comm.Op
	}
	mix := []spec{
		{comm.KindAllReduce, comm.Float32, comm.Sum}, {comm.KindAllReduce, comm.Float32, comm.Sum},
		{comm.KindAllReduce, comm.Float32, comm.Max}, {comm.KindAllReduce, comm.Float32, comm.Max},
		{comm.KindAllReduce, comm.Float64, comm.Max}, {comm.KindBroadcast, comm.Float64, 0},
		{comm.KindAllReduce, comm.Float64, comm.Max}, {comm.KindAllReduce, comm.Int32, comm.Max},
		{comm.KindAllReduce, comm.Int32, comm.Max}, {comm.KindAllReduce, comm.Int32, comm.Max},
	}
	errs := onEach(t, n, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		ictx := comm.IssuerWaits(ctx)
		var hs []comm.Handle
		for round := range 3 {
			for i, s := range mix {
				b := make([]byte, 16*s.dt.Size())
				fuseInput(s.dt, b, 9, round*100+i, r)
				buf, _ := comm.Bytes(s.dt, b)
				if s.kind == comm.KindBroadcast {
					hs = append(hs, j.comms[r].Broadcast(ictx, buf, buf, 1))
				} else {
					hs = append(hs, j.comms[r].AllReduce(ictx, buf, buf, s.op))
				}
			}
		}
		for _, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, c := range j.comms {
		recs := c.FlightRecords()
		checkFusedRecords(t, r, recs)
		// Every run of equal all-reduces ran as one message: the rule
		// allows it and every rank had all of them queued.
		var got []int
		for i := 0; i < len(recs); i += max(recs[i].Fused, 1) {
			got = append(got, max(recs[i].Fused, 1))
		}
		want := []int{2, 2, 1, 1, 1, 3, 2, 2, 1, 1, 1, 3, 2, 2, 1, 1, 1, 3}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("rank %d: messages of %v calls, want %v", r, got, want)
		}
	}
}

// A rank whose call differs from the others' inside a fused message gets
// a DesyncError naming both calls, never wrong data: another count at the
// third call of a message (found in the message's count list), another
// op or kind there (which ends the offer, and the frames of the next
// message differ), and a rank with fusion off against ranks that fuse.
func TestFusionDesync(t *testing.T) {
	type tc struct {
		name   string
		change func(i int, count *int, op *comm.Op, bcast *bool)
		off0   bool // rank 0 does not fuse
		mine   string
		theirs string
		seq    uint64
	}
	tcs := []tc{
		{name: "count", change: func(i int, count *int, _ *comm.Op, _ *bool) {
			if i == 2 {
				*count = 32
			}
		}, mine: "AllReduce(float32 sum, count=64) #3", theirs: "AllReduce(float32 sum, count=32) #3", seq: 3},
		{name: "op", change: func(i int, _ *int, op *comm.Op, _ *bool) {
			if i == 2 {
				*op = comm.Max
			}
		}, mine: "AllReduce(float32 sum, count=64) #3", theirs: "AllReduce(float32 max, count=64) #3", seq: 3},
		{name: "kind", change: func(i int, _ *int, _ *comm.Op, b *bool) {
			if i == 2 {
				*b = true
			}
		}, mine: "AllReduce(float32 sum, count=64) #3", theirs: "Broadcast(float32, count=64, root=0) #3", seq: 3},
		{name: "fusebytes", off0: true, mine: "AllReduce(float32 sum, count=64) #1", theirs: "AllReduce(float32 sum, count=64) #1", seq: 1},
	}
	for _, tc := range tcs {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2
			cfg := comm.LocalConfig()
			j := newMixedMemJob(t, n, func(r int) comm.Config {
				c := cfg
				if tc.off0 && r == 0 {
					c.FuseBytes = 0
				}
				return c
			})
			for _, c := range j.comms {
				t.Cleanup(func() { c.Abort(nil); _ = c.Close() })
			}
			bufs := make([][]float32, n)
			errs := onEach(t, n, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				ictx := comm.IssuerWaits(ctx)
				var hs []comm.Handle
				for i := range 5 {
					count, op, bcast := 64, comm.Sum, false
					if r == 1 && tc.change != nil {
						tc.change(i, &count, &op, &bcast)
					}
					buf := make([]float32, count)
					for k := range buf {
						buf[k] = 1e9 // a sum that lands in the buffer would show
					}
					if i == 2 {
						bufs[r] = buf
					}
					if bcast {
						hs = append(hs, j.comms[r].Broadcast(ictx, comm.Float32s(buf), comm.Float32s(buf), 0))
					} else {
						hs = append(hs, j.comms[r].AllReduce(ictx, comm.Float32s(buf), comm.Float32s(buf), op))
					}
				}
				var first error
				for _, h := range hs {
					if err := h.Wait(ctx); err != nil && first == nil {
						first = err
					}
				}
				return first
			})
			for r, err := range errs {
				var de *comm.DesyncError
				if !errors.As(err, &de) {
					t.Fatalf("rank %d: %v, want a DesyncError", r, err)
				}
				t.Logf("rank %d: %v", r, err)
				// The error names both calls, the detecting rank's (de.Rank)
				// as Mine: this rank's own, or the peer's when its abort
				// brought the error.
				mine, theirs := tc.mine, tc.theirs
				if de.Rank == 1 {
					mine, theirs = theirs, mine
				}
				if de.Mine.String() != mine || de.Theirs.String() != theirs {
					t.Errorf("rank %d: %v names %s against %s, want %s against %s", r, err, de.Mine, de.Theirs, mine, theirs)
				}
			}
			// No sum of the mismatched call reached its buffer.
			for r, b := range bufs {
				if len(b) > 0 && b[0] != 1e9 {
					t.Errorf("rank %d: the mismatched call's buffer holds %v", r, b[0])
				}
			}
		})
	}
}

// AllReduceCoalesced: one call, one record, every vector reduced (fused
// where small, in turn where large), over 2 and 4 ranks, issued alone or
// queued with plain all-reduces of the same dtype and op.
func TestAllReduceCoalesced(t *testing.T) {
	for _, n := range []int{2, 4} {
		j := newMemJob(t, n, comm.LocalConfig())
		counts := []int{3, 250, 1, 20000, 64, 64}
		errs := onEach(t, n, func(r int) error {
			ctx, cancel := waitCtx(t)
			defer cancel()
			for round := range 4 {
				var sends, recvs []comm.Buffer
				var outs [][]int32
				for i, c := range counts {
					s, o := make([]int32, c), make([]int32, c)
					for k := range s {
						s[k] = int32((r + 1) * (i + k + round))
					}
					sends, recvs, outs = append(sends, comm.Int32s(s)), append(recvs, comm.Int32s(o)), append(outs, o)
				}
				ictx := ctx
				if round%2 == 1 {
					ictx = comm.IssuerWaits(ctx) // queued with the plain calls below before any runs
				}
				h := j.comms[r].AllReduceCoalesced(ictx, sends, recvs, comm.Sum)
				plain := []int32{int32(r)}
				h2 := j.comms[r].AllReduce(ictx, comm.Int32s(plain), comm.Int32s(plain), comm.Sum)
				if err := h.Wait(ctx); err != nil {
					return err
				}
				if err := h2.Wait(ctx); err != nil {
					return err
				}
				tri := int32(n * (n + 1) / 2)
				for i, o := range outs {
					for k, v := range o {
						if want := tri * int32(i+k+round); v != want {
							return fmt.Errorf("round %d vector %d element %d: %d, want %d", round, i, k, v, want)
						}
					}
				}
				if want := int32(n * (n - 1) / 2); plain[0] != want {
					return fmt.Errorf("round %d: plain all-reduce %d, want %d", round, plain[0], want)
				}
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("n=%d rank %d: %v", n, r, err)
			}
		}
		total := 0
		for _, c := range counts {
			total += c
		}
		for r, c := range j.comms {
			recs := c.FlightRecords()
			checkFusedRecords(t, r, recs)
			if len(recs) != 8 || recs[0].Call.Count != total || recs[1].Call.Count != 1 {
				t.Fatalf("n=%d rank %d: %d records, first %v: want 8, the coalesced call of %d elements then the plain one", n, r, len(recs), recs[0].Call, total)
			}
		}
	}
	// Bad input: a clear error naming the vector.
	j := newMemJob(t, 1, comm.LocalConfig())
	ctx, cancel := waitCtx(t)
	defer cancel()
	err := j.comms[0].AllReduceCoalesced(ctx, []comm.Buffer{comm.Int32s(make([]int32, 2)), comm.Int32s(make([]int32, 3))},
		[]comm.Buffer{comm.Int32s(make([]int32, 2)), comm.Int32s(make([]int32, 2))}, comm.Sum).Wait(ctx)
	if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "send 1 has 3 elements and recv 1 has 2") {
		t.Fatalf("mismatched vector: %v", err)
	}
}

// Ranks whose coalesced calls differ get a DesyncError naming both, from
// the fused message: another length of one vector, and the same vectors
// split into calls differently (one coalesced call against two plain ones).
func TestAllReduceCoalescedDesync(t *testing.T) {
	for _, tc := range []struct {
		name  string
		split bool
		want  string
	}{
		{"length", false, "count=32"},
		{"split", true, "coalesced calls split differently"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newMemJob(t, 2, comm.LocalConfig())
			for _, c := range j.comms {
				t.Cleanup(func() { c.Abort(nil); _ = c.Close() })
			}
			errs := onEach(t, 2, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				ictx := comm.IssuerWaits(ctx)
				b := func(c int) comm.Buffer { return comm.Float32s(make([]float32, c)) }
				var hs []comm.Handle
				switch {
				case r == 1 && tc.split:
					hs = append(hs, j.comms[r].AllReduce(ictx, b(64), b(64), comm.Sum), j.comms[r].AllReduce(ictx, b(64), b(64), comm.Sum))
				case r == 1:
					hs = append(hs, j.comms[r].AllReduceCoalesced(ictx, []comm.Buffer{b(64), b(32)}, []comm.Buffer{b(64), b(32)}, comm.Sum))
				default:
					x, y := b(64), b(64)
					hs = append(hs, j.comms[r].AllReduceCoalesced(ictx, []comm.Buffer{x, y}, []comm.Buffer{x, y}, comm.Sum))
				}
				var first error
				for _, h := range hs {
					if err := h.Wait(ctx); err != nil && first == nil {
						first = err
					}
				}
				return first
			})
			for r, err := range errs {
				var de *comm.DesyncError
				if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("rank %d: %v, want a DesyncError with %q", r, err, tc.want)
				}
				t.Logf("rank %d: %v", r, err)
			}
		})
	}
}
