package comm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"golang.org/x/sync/errgroup"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

type netJob struct {
	eps   []*comm.Endpoint
	comms []*comm.Comm
	logs  *syncBuf
}

// syncBuf collects log lines from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testRingBytes, when set, shrinks the shared-memory rings of endpoints
// made by listen (tests that need full rings).
var testRingBytes int

// testTCPStreams, when set, is the TCPStreams of endpoints made by listen.
var testTCPStreams int

// testLinkLease, when set, is the LinkLease of endpoints made by listen.
var testLinkLease time.Duration

func listen(t testing.TB, forceTCP bool, secret []byte, logs io.Writer, shmDir string) *comm.Endpoint {
	t.Helper()
	ecfg := comm.DefaultEndpointConfig()
	if testRingBytes != 0 {
		ecfg.ShmRingBytes = testRingBytes
	}
	ecfg.TCPStreams = testTCPStreams
	ecfg.LinkLease = testLinkLease
	ecfg.Addr = "127.0.0.1:0"
	ecfg.Secret = secret
	ecfg.ForceTCP = forceTCP
	ecfg.ShmDir = shmDir // tests check that nothing is left there
	ecfg.Logger = testLogger(t)
	if logs != nil {
		ecfg.Logger = ecfg.Logger.Output(logs)
	}
	ep, err := comm.Listen(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// newNetJob starts n communicators over real loopback sockets (and shared
// memory unless forceTCP) in this process.
func newNetJob(t testing.TB, n int, cfg comm.Config, forceTCP bool) *netJob {
	t.Helper()
	return newNetJobOn(t, n, cfg, forceTCP, nil)
}

// newNetJobOn is newNetJob with the ranks' hosts named (nil: every rank
// on its address's host).
func newNetJobOn(t testing.TB, n int, cfg comm.Config, forceTCP bool, hosts []string) *netJob {
	t.Helper()
	j := &netJob{logs: &syncBuf{}}
	var addrs []string
	shmDir := t.TempDir()
	if dir := os.Getenv("GORUN_TEST_SHMDIR"); dir != "" {
		shmDir = dir
	}
	for range n {
		ep := listen(t, forceTCP, testSecret, j.logs, shmDir)
		j.eps = append(j.eps, ep)
		addrs = append(addrs, ep.Addr())
	}
	cfg.Logger = testLogger(t)
	j.comms = make([]*comm.Comm, n)
	errs := onEach(t, n, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		c, err := comm.New(ctx, commtest.NewStaticGroup(r, addrs, hosts), j.eps[r], cfg)
		j.comms[r] = c
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for r := range n {
			wg.Go(func() { _ = j.comms[r].Close(); _ = j.eps[r].Close() })
		}
		wg.Wait()
	})
	return j
}

func runCases(t *testing.T, comms []*comm.Comm, tcs []tcase, exact bool) {
	n := len(comms)
	errs := onEach(t, n, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		hs := make([]comm.Handle, len(tcs))
		checks := make([]func() error, len(tcs))
		for i, tc := range tcs {
			hs[i], checks[i] = issue(ctx, comms[r], tc, exact)
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return fmt.Errorf("%v: %w", tcs[i], err)
			}
			if err := checks[i](); err != nil {
				return err
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestCollectivesOverSockets(t *testing.T) {
	sizes := []int{0, 1, 13, 20001}
	if testing.Short() {
		sizes = []int{0, 13, 20001}
	}
	for _, medium := range []string{"tcp", "shm"} {
		for _, n := range []int{2, 3} {
			for _, det := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/n=%d/det=%v", medium, n, det), func(t *testing.T) {
					cfg := comm.LocalConfig()
					cfg.Deterministic = det
					cfg.SegmentBytes = 64 << 10
					cfg.TCPSegmentBytes = 64 << 10
					cfg.LatencyNs = 100
					j := newNetJob(t, n, cfg, medium == "tcp")
					for r, k := range j.comms[0].LinkKinds() {
						if r != 0 && k != medium {
							t.Fatalf("link to rank %d is %q, want %q", r, k, medium)
						}
					}
					var tcs []tcase
					for _, tc := range cases(n, sizes) {
						// A subset of dtypes and ops over real sockets; the
						// in-memory suite covers every combination.
						if (tc.dt == comm.Float32 || tc.dt == comm.BFloat16) && (tc.op == 0 || tc.op == comm.Sum) {
							tcs = append(tcs, tc)
						}
					}
					runCases(t, j.comms, tcs, !det)
				})
			}
		}
	}
}

// Shared-memory segments are unlinked as soon as both sides mapped them.
// The job must really use shared memory for this to mean anything: while
// it runs, this process maps a segment per pair of ranks from dir, every
// one of them already deleted.
func TestShmSegmentsLeaveNoFiles(t *testing.T) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps to see the mappings: %v", err)
	}
	dir := t.TempDir()
	t.Setenv("GORUN_TEST_SHMDIR", dir)
	j := newNetJob(t, 3, comm.LocalConfig(), false)
	ctx, cancel := waitCtx(t)
	defer cancel()
	onEach(t, 3, func(r int) error { return j.comms[r].Barrier(ctx).Wait(ctx) })
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("left in %s: %v", dir, ents)
	}
	maps, _ = os.ReadFile("/proc/self/maps")
	segments := map[string]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		i := strings.Index(line, dir+"/")
		if i < 0 {
			continue
		}
		name, deleted := strings.CutSuffix(line[i:], " (deleted)")
		if !deleted {
			t.Errorf("segment mapped but not unlinked: %s", name)
		}
		segments[name] = true
	}
	if len(segments) < 3 {
		t.Errorf("%d shared-memory segments mapped from %s, want one per pair of 3 ranks (is shared memory in use?)", len(segments), dir)
	}
	if m, _ := filepath.Glob("/dev/shm/gorun-*"); len(m) > 0 {
		t.Logf("note: /dev/shm holds %v (other processes?)", m)
	}
}

// A foreign process that connects to a data port, with garbage or with a
// wrong secret, is dropped and logged; the job does not notice.
func TestForeignConnectionsAreDropped(t *testing.T) {
	for _, medium := range []string{"tcp", "shm"} {
		t.Run(medium, func(t *testing.T) {
			j := newNetJob(t, 2, comm.LocalConfig(), medium == "tcp")
			addr := j.eps[1].Addr()
			// 1. Garbage.
			c1, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c1.Write([]byte("GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"))
			_, _ = io.ReadAll(c1) // the endpoint hangs up
			c1.Close()
			// 2. A well-formed client that does not know the secret.
			c2, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c2.Write(append([]byte("GORUNDP2"), make([]byte, 32)...))
			br := bufio.NewReader(c2)
			_, _ = io.ReadFull(br, make([]byte, 64))
			_, _ = c2.Write(make([]byte, 32+30))
			_, _ = io.ReadAll(br)
			c2.Close()
			// 3. A peer endpoint with another job's secret.
			stranger := listen(t, false, []byte("another job's secret, 32 bytes!"), nil, t.TempDir())
			defer stranger.Close()
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			g := commtest.NewStaticGroup(0, []string{stranger.Addr(), addr}, nil)
			if _, err := stranger.Connect(ctx, g, 1); err == nil || !strings.Contains(err.Error(), "secret") {
				t.Errorf("stranger connected: %v", err)
			}
			// The job still works.
			runCases(t, j.comms, cases(2, []int{5})[:3], true)
			// The endpoint logs the stranger once it hangs up: poll.
			for strings.Count(j.logs.String(), "dropped data-plane connection") < 3 {
				select {
				case <-ctx.Done():
					t.Fatalf("foreign connections not logged:\n%s", j.logs.String())
				case <-time.After(5 * time.Millisecond):
				}
			}
		})
	}
}

// Messages many times larger than the ring and the sender's queue: both
// ranks send and receive at once, and neither may wait on the other's
// queue (a deadlock found at 64 MiB before messages were queued whole).
func TestLargeMessagesDoNotDeadlock(t *testing.T) {
	testRingBytes = 64 << 10
	defer func() { testRingBytes = 0 }()
	for _, medium := range []string{"shm", "tcp"} {
		for _, n := range []int{2, 3} {
			cfg := comm.LocalConfig()
			cfg.SegmentBytes = 4096
			cfg.TCPSegmentBytes = 4096
			cfg.LatencyNs = 1e-3
			j := newNetJob(t, n, cfg, medium == "tcp")
			const count = 1 << 20 // 4 MiB: 1000 segments per message
			errs := onEach(t, n, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				a := f32(count, float32(r+1))
				out := make([]float32, count)
				h1 := j.comms[r].AllReduce(ctx, comm.Float32s(a), comm.Float32s(a), comm.Sum)
				h2 := j.comms[r].AllToAll(ctx, comm.Float32s(f32(count-count%n, float32(r))), comm.Float32s(out[:count-count%n]))
				if err := comm.WaitAll(ctx, h1, h2); err != nil {
					return err
				}
				if want := float32(n * (n + 1) / 2); a[count-1] != want {
					return fmt.Errorf("rank %d: %v, want %v", r, a[count-1], want)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("%s n=%d rank %d: %v", medium, n, r, err)
				}
			}
		}
	}
}

// Several communicators share one endpoint per rank; each has its own
// connections, so a group stalled on one rank does not hold another group.
func TestGroupsShareEndpointsAndProgressIndependently(t *testing.T) {
	for _, medium := range []string{"shm", "tcp"} {
		t.Run(medium, func(t *testing.T) {
			j := newNetJob(t, 3, comm.LocalConfig(), medium == "tcp") // world: ranks 0,1,2
			addrs := []string{j.eps[0].Addr(), j.eps[1].Addr(), j.eps[2].Addr()}
			// A second group over the same endpoints with another tag, and
			// a subgroup {0, 2}.
			cfg := comm.LocalConfig()
			cfg.Tag = "stream-2"
			world2 := make([]*comm.Comm, 3)
			sub := make([]*comm.Comm, 3)
			errs := onEach(t, 3, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				var err error
				if world2[r], err = comm.New(ctx, commtest.NewStaticGroup(r, addrs, nil), j.eps[r], cfg); err != nil {
					return err
				}
				if r != 1 {
					sr := r / 2
					sub[r], err = comm.New(ctx, commtest.NewStaticGroup(sr, []string{addrs[0], addrs[2]}, nil), j.eps[r], comm.LocalConfig())
				}
				return err
			})
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			defer func() {
				for _, c := range append(world2, sub...) {
					if c != nil {
						_ = c.Close()
					}
				}
			}()
			ctx, cancel := waitCtx(t)
			defer cancel()
			// Ranks 0 and 2 start a world all-reduce that rank 1 joins only
			// at the end; meanwhile both other groups must complete.
			bufs := [][]float32{f32(8, 1), f32(8, 1), f32(8, 1)}
			stalled := []comm.Handle{
				j.comms[0].AllReduce(ctx, comm.Float32s(bufs[0]), comm.Float32s(bufs[0]), comm.Sum),
				j.comms[2].AllReduce(ctx, comm.Float32s(bufs[2]), comm.Float32s(bufs[2]), comm.Sum),
			}
			errs = onEach(t, 3, func(r int) error {
				b := f32(4, float32(r))
				if err := world2[r].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum).Wait(ctx); err != nil || b[0] != 3 {
					return fmt.Errorf("world2: %v %v", err, b)
				}
				if sub[r] != nil {
					b := f32(4, float32(r))
					if err := sub[r].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum).Wait(ctx); err != nil || b[0] != 2 {
						return fmt.Errorf("sub: %v %v", err, b)
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			for _, h := range stalled {
				if h.Done() {
					t.Fatal("world all-reduce finished without rank 1")
				}
			}
			if err := j.comms[1].AllReduce(ctx, comm.Float32s(bufs[1]), comm.Float32s(bufs[1]), comm.Sum).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if err := comm.WaitAll(ctx, stalled...); err != nil || bufs[0][0] != 3 {
				t.Fatalf("%v %v", err, bufs[0])
			}
		})
	}
}

// A segment left by a process that died mid-handshake is removed by the next
// endpoint on the host; segments of live processes are not touched.
func TestListenSweepsSegmentsOfDeadProcesses(t *testing.T) {
	dir := t.TempDir()
	dead := filepath.Join(dir, "gorun-999999999-0000000000000001-0-1-ab")
	live := filepath.Join(dir, fmt.Sprintf("gorun-%d-0000000000000001-0-1-cd", os.Getpid()))
	other := filepath.Join(dir, "unrelated")
	for _, f := range []string{dead, live, other} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ep := listen(t, false, testSecret, nil, dir)
	defer ep.Close()
	for f, want := range map[string]bool{dead: false, live: true, other: true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s: exists=%v, want %v", filepath.Base(f), err == nil, want)
		}
	}
}

// The two-rank pair exchange cuts halves into several segments of unequal
// element counts (odd counts give halves one element apart), over shared
// memory and the in-memory network, for every dtype and op, in and out of
// place.
func TestPairAllReduceSegments(t *testing.T) {
	for _, medium := range []string{"mem", "shm"} {
		t.Run(medium, func(t *testing.T) {
			cfg := comm.LocalConfig()
			cfg.SegmentBytes = 64 << 10 // the smallest the pair exchange takes
			cfg.LatencyNs = 1e-3
			var comms []*comm.Comm
			if medium == "mem" {
				comms = newMemJob(t, 2, cfg).comms
			} else {
				comms = newNetJob(t, 2, cfg, false).comms
			}
			var tcs []tcase
			for _, tc := range cases(2, []int{40001, 70001}) {
				if tc.kind == comm.KindAllReduce {
					tcs = append(tcs, tc)
				}
			}
			runCases(t, comms, tcs, true)
		})
	}
}

// Over shared memory a small message travels through a fast slot and a
// large one through the ring; ranks whose calls differ in size, so that
// one writes a slot while the other writes the ring, still both get an
// error naming both calls.
func TestDesyncAcrossShmPaths(t *testing.T) {
	for _, big := range []int{1, 256 << 10} {
		t.Run(fmt.Sprintf("big=%d", big), func(t *testing.T) {
			j := newNetJob(t, 2, comm.LocalConfig(), false)
			errs := onEach(t, 2, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				var err error
				if r == 0 {
					b := f32(2, 1)
					err = j.comms[0].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum).Wait(ctx)
				} else {
					b := f32(big, 1)
					out := make([]float32, 2*big)
					err = j.comms[1].AllGather(ctx, comm.Float32s(b), comm.Float32s(out)).Wait(ctx)
				}
				if err == nil {
					err = j.comms[r].Barrier(ctx).Wait(ctx)
				}
				return err
			})
			for r, err := range errs {
				if !errors.Is(err, comm.ErrDesync) || !strings.Contains(err.Error(), "AllReduce(") || !strings.Contains(err.Error(), "AllGather(") {
					t.Errorf("rank %d: %v, want a desync naming both calls", r, err)
				}
			}
		})
	}
}

// An outsider that shares the peers' address (here, loopback) and holds
// more silent connections to a rank's data port than one source's share
// (MaxHandshakesPerSource, 128) does not keep a real peer out: the oldest
// held connections give way, and the peers connect at once instead of
// after the greeting timeout (5 s) that frees a held slot.
func TestHeldConnectionsGiveWay(t *testing.T) {
	secret := []byte("held connections test secret, 32")
	a := listen(t, true, secret, io.Discard, t.TempDir())
	defer a.Close()
	b := listen(t, true, secret, io.Discard, t.TempDir())
	defer b.Close()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 300 {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // accepted
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	addrs := []string{a.Addr(), b.Addr()}
	start := time.Now()
	var eg errgroup.Group
	for r, ep := range []*comm.Endpoint{a, b} {
		eg.Go(func() error {
			links, err := ep.Connect(ctx, commtest.NewStaticGroup(r, addrs, nil), 1)
			for _, l := range links {
				if l != nil {
					l.Close()
				}
			}
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the peers connected after %v past 300 held connections, want well under a second", took)
	}
}
