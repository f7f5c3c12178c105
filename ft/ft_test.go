package ft_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/rankenv"
)

// The test binary is the worker (house style): with workerEnv set it runs
// one replica of toyTrain and exits.
const workerEnv = "FT_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(worker())
	}
	goleak.VerifyTestMain(m)
}

// toy is a deterministic trainer's state: parameters and a momentum, the
// gradient a function of (replica, step, parameters).
type toy struct {
	p, v []float32
}

func newToy(n int) *toy {
	t := &toy{p: make([]float32, n), v: make([]float32, n)}
	for i := range t.p {
		t.p[i] = float32(i%13) * 0.1
	}
	return t
}

func (t *toy) grad(replica int, step int64) []float32 {
	g := make([]float32, len(t.p))
	for i := range g {
		g[i] = float32(math.Sin(float64(i)*0.01+float64(replica)*0.7+float64(step)*0.3)) - 0.01*t.p[i]
	}
	return g
}

func (t *toy) apply(g []float32) {
	for i := range t.p {
		t.v[i] = 0.9*t.v[i] + g[i]
		t.p[i] -= 0.05 * t.v[i]
	}
}

func (t *toy) Save() ([]byte, error) {
	b := make([]byte, 0, 8*len(t.p))
	for _, s := range [][]float32{t.p, t.v} {
		for _, x := range s {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b, nil
}

func (t *toy) Load(b []byte) error {
	if len(b) != 8*len(t.p) {
		return fmt.Errorf("state of %d bytes, want %d", len(b), 8*len(t.p))
	}
	for i := range t.p {
		t.p[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		t.v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*(len(t.p)+i):]))
	}
	return nil
}

func (t *toy) digest() string {
	b, _ := t.Save()
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

// stepLog is what one replica saw at one step.
type stepLog struct {
	step      int64 // the committed step the quorum started at
	size      int
	committed bool
	healed    bool
}

// hooks let a test kill a replica at a chosen point.
type hooks struct {
	afterReduce func(step int64) // between the all-reduce and the vote
	inSave      func()           // serving a heal
	inLoad      func()           // receiving a heal
}

// train runs steps committed steps of the toy on m.
func train(ctx context.Context, m *ft.Manager, st *toy, steps int64, h hooks, log func(stepLog)) error {
	m.SetState(ft.StateFuncs{
		SaveFunc: func() ([]byte, error) {
			if h.inSave != nil {
				h.inSave()
			}
			return st.Save()
		},
		LoadFunc: func(b []byte) error {
			if h.inLoad != nil {
				h.inLoad()
			}
			return st.Load(b)
		},
	})
	for m.Step() < steps {
		q, err := m.Quorum(ctx)
		if err != nil {
			return err
		}
		step := m.Step()
		g := st.grad(m.Replica(), step)
		_ = m.AllReduce(ctx, g, comm.Avg)
		if h.afterReduce != nil {
			h.afterReduce(step)
		}
		ok, err := m.ShouldCommit(ctx)
		if err != nil {
			return err
		}
		if ok {
			st.apply(g)
		}
		log(stepLog{step: step, size: q.Size(), committed: ok, healed: len(q.Healed) > 0})
	}
	return nil
}

func secretHex() string { return strings.Repeat("ab", 32) }

func newServer(t *testing.T, replicas int) *ft.Server {
	t.Helper()
	sec, _ := hex.DecodeString(secretHex())
	s, err := ft.NewServer(ft.ServerConfig{Addr: "127.0.0.1:0", JobID: "ftjob", Secret: sec, Replicas: replicas})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func replicaEnv(s *ft.Server, replica, replicas, inc int) map[string]string {
	return map[string]string{
		rankenv.GorunRank:      strconv.Itoa(replica),
		rankenv.GorunWorldSize: strconv.Itoa(replicas),
		rankenv.JobID:          "ftjob",
		rankenv.Secret:         secretHex(),
		rankenv.GorunHost:      "localhost",
		ft.AddrEnv:             s.Addr(),
		ft.IncarnationEnv:      strconv.Itoa(inc),
	}
}

func testConfig(env map[string]string) ft.Config {
	cfg := ft.DefaultConfig()
	cfg.Lookup = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg.Endpoint.ForceTCP = true
	cfg.Comm.ConnectTimeout = 10 * time.Second
	cfg.Comm.AbortTimeout = 500 * time.Millisecond
	return cfg
}

// TestQuorumAveragesAndCommits: three replicas in one process agree on
// one quorum, average over three, commit every step, and end bitwise
// equal to a serial computation of the same steps.
func TestQuorumAveragesAndCommits(t *testing.T) {
	const n, steps = 3, 5
	s := newServer(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	states := make([]*toy, n)
	logs := make([][]stepLog, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		states[r] = newToy(1000)
		wg.Go(func() {
			m, err := ft.Join(ctx, testConfig(replicaEnv(s, r, n, 0)))
			if err != nil {
				errs[r] = err
				return
			}
			defer m.Close()
			errs[r] = train(ctx, m, states[r], steps, hooks{}, func(l stepLog) { logs[r] = append(logs[r], l) })
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
	}
	// The serial reference: the same averages in the deterministic tree's
	// order ((g0+g1)+g2)/3.
	ref := newToy(1000)
	for step := range int64(steps) {
		g0, g1, g2 := ref.grad(0, step), ref.grad(1, step), ref.grad(2, step)
		avg := make([]float32, len(g0))
		for i := range avg {
			avg[i] = ((g0[i] + g1[i]) + g2[i]) / 3
		}
		ref.apply(avg)
	}
	for r := range n {
		if states[r].digest() != ref.digest() {
			t.Errorf("replica %d: state %s, the serial reference %s", r, states[r].digest(), ref.digest())
		}
		for _, l := range logs[r] {
			if !l.committed || l.size != n {
				t.Errorf("replica %d step %d: committed=%v size=%d, want committed by %d", r, l.step, l.committed, l.size, n)
			}
		}
	}
	rec := s.Record()
	if rec.Commits != steps || len(rec.Quorums) != 1 || len(rec.Losses) != 0 {
		t.Errorf("record: %d commits, %d quorums, %d losses; want %d, 1, 0", rec.Commits, len(rec.Quorums), len(rec.Losses), steps)
	}
}

// TestWrongSecretRefused: a replica without the job's secret cannot join.
func TestWrongSecretRefused(t *testing.T) {
	s := newServer(t, 2)
	env := replicaEnv(s, 0, 2, 0)
	env[rankenv.Secret] = strings.Repeat("cd", 32)
	_, err := ft.Join(context.Background(), testConfig(env))
	if err == nil {
		t.Fatal("a replica with the wrong secret joined")
	}
	t.Log(err)
}

// TestNotFaultTolerant: without the service's address, Join says why.
func TestNotFaultTolerant(t *testing.T) {
	_, err := ft.Join(context.Background(), testConfig(map[string]string{}))
	if !errors.Is(err, ft.ErrNotFaultTolerant) {
		t.Fatalf("Join: %v, want ErrNotFaultTolerant", err)
	}
}

// TestShouldCommitFalseOnReportedError: one replica's reported error
// uncommits the step on every replica, and the next step commits.
func TestShouldCommitFalseOnReportedError(t *testing.T) {
	const n = 2
	s := newServer(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	got := make([][]bool, n)
	errs := make([]error, n)
	for r := range n {
		wg.Go(func() {
			m, err := ft.Join(ctx, testConfig(replicaEnv(s, r, n, 0)))
			if err != nil {
				errs[r] = err
				return
			}
			defer m.Close()
			for i := range 3 {
				if _, err := m.Quorum(ctx); err != nil {
					errs[r] = err
					return
				}
				g := []float32{1, 2, 3}
				_ = m.AllReduce(ctx, g, comm.Sum)
				if i == 1 && r == 1 {
					m.ReportError(errors.New("data loader broke"))
				}
				ok, err := m.ShouldCommit(ctx)
				if err != nil {
					errs[r] = err
					return
				}
				got[r] = append(got[r], ok)
			}
		})
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("replica %d: %v", r, errs[r])
		}
		if fmt.Sprint(got[r]) != "[true false true]" {
			t.Errorf("replica %d: commits %v, want [true false true]", r, got[r])
		}
	}
	if rec := s.Record(); len(rec.Uncommitted) != 1 || !strings.Contains(rec.Uncommitted[0].Why, "data loader broke") {
		t.Errorf("record's uncommitted steps: %+v", rec.Uncommitted)
	}
}

// worker is one replica in its own process (the process tests): it
// trains FT_STEPS steps of the toy and prints a line per step and its
// digest; FT_KILL says where it SIGKILLs itself.
func worker() int {
	steps, _ := strconv.ParseInt(os.Getenv("FT_STEPS"), 10, 64)
	cfg := testConfig(nil)
	cfg.Lookup = os.LookupEnv
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := ft.Join(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "join:", err)
		return 2
	}
	die := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); time.Sleep(time.Minute) }
	var h hooks
	kill := os.Getenv("FT_KILL") // "reduce:STEP", "save", "load"
	switch {
	case strings.HasPrefix(kill, "reduce:"):
		at, _ := strconv.ParseInt(strings.TrimPrefix(kill, "reduce:"), 10, 64)
		h.afterReduce = func(step int64) {
			if step == at {
				die()
			}
		}
	case kill == "save":
		h.inSave = die
	case kill == "load":
		h.inLoad = die
	}
	st := newToy(50_000)
	out := bufio.NewWriter(os.Stdout)
	err = train(ctx, m, st, steps, h, func(l stepLog) {
		fmt.Fprintf(out, "step %d size %d committed %v healed %v\n", l.step, l.size, l.committed, l.healed)
		out.Flush()
		time.Sleep(20 * time.Millisecond) // give replacements time to arrive mid-run
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "train:", err)
		return 3
	}
	fmt.Fprintf(out, "digest %d %d %s\n", m.Replica(), m.Step(), st.digest())
	out.Flush()
	if err := m.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
	}
	return 0
}

// TestFirstQuorumWaitsForEveryReplica: the first quorum holds the whole
// job, not whoever connected first; a replica reported dead before it
// connected is not waited for.
func TestFirstQuorumWaitsForEveryReplica(t *testing.T) {
	s := newServer(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type res struct {
		q   ft.Quorum
		err error
	}
	got := make(chan res, 2)
	var ms []*ft.Manager
	for r := range 2 {
		m, err := ft.Join(ctx, testConfig(replicaEnv(s, r, 3, 0)))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	for _, m := range ms {
		go func() { q, err := m.Quorum(ctx); got <- res{q, err} }() // owned: drained below
	}
	select {
	case r := <-got:
		t.Fatalf("a quorum of %d was answered before replica 2 joined or was lost (err %v)", r.q.Size(), r.err)
	case <-time.After(300 * time.Millisecond):
	}
	s.Lost(2, 0, "never started")
	for range 2 {
		r := <-got
		if r.err != nil || r.q.Size() != 2 || r.q.Step != 0 {
			t.Fatalf("quorum %+v, %v; want replicas 0 and 1 at step 0", r.q, r.err)
		}
	}
	if rec := s.Record(); len(rec.Losses) != 1 || rec.Losses[0].Replica != 2 {
		t.Errorf("losses %+v, want replica 2", rec.Losses)
	}
}

// TestCallsOutOfOrder: ShouldCommit and AllReduce outside a quorum are
// refused, not silently run.
func TestCallsOutOfOrder(t *testing.T) {
	s := newServer(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := ft.Join(ctx, testConfig(replicaEnv(s, 0, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.ShouldCommit(ctx); !errors.Is(err, ft.ErrPhase) {
		t.Errorf("ShouldCommit before Quorum: %v, want ErrPhase", err)
	}
	if err := m.AllReduce(ctx, []float32{1}, comm.Sum); !errors.Is(err, ft.ErrPhase) {
		t.Errorf("AllReduce before Quorum: %v, want ErrPhase", err)
	}
	if _, err := m.Quorum(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.ShouldCommit(ctx); !ok || err != nil {
		t.Fatalf("a lone replica's commit: %v, %v", ok, err)
	}
	if _, err := m.ShouldCommit(ctx); !errors.Is(err, ft.ErrPhase) {
		t.Errorf("a second ShouldCommit: %v, want ErrPhase", err)
	}
	if m.Step() != 1 {
		t.Errorf("step %d after one commit", m.Step())
	}
}

// TestStrangerRefused: a connection that does not speak the handshake
// (an endless line, a forged proof) is dropped, and the service goes on
// serving the job's replicas.
func TestStrangerRefused(t *testing.T) {
	s := newServer(t, 1)
	for _, junk := range []string{
		strings.Repeat("x", 64<<10),
		"GORUN-FT/1 ftjob 0 0 abcd\n" + strings.Repeat("0", 64) + "\n",
	} {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte(junk))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadAll(c) // EOF or a reset: dropped either way
		c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the service kept a stranger's connection open: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := ft.Join(ctx, testConfig(replicaEnv(s, 0, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Quorum(ctx); err != nil {
		t.Fatalf("a real replica after the strangers: %v", err)
	}
	if rec := s.Record(); len(rec.Joins) != 1 {
		t.Errorf("joins %+v: a stranger was counted", rec.Joins)
	}
}

// TestReplicaGroups: with groups of 2, each rank's participants are the
// ranks at its place in every group, its Group its own group; the loss of
// one rank takes its whole group out of the next quorum.
func TestReplicaGroups(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, ms := joinGroups(ctx, t, 4, 2)
	ids := func(ps []ft.Participant) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.Replica)
		}
		return out
	}
	qs := make([]ft.Quorum, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r, m := range ms {
		wg.Go(func() {
			if qs[r], errs[r] = m.Quorum(ctx); errs[r] == nil {
				_, errs[r] = m.ShouldCommit(ctx)
			}
		})
	}
	wg.Wait()
	for r := range ms {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		wantParts, wantGroup := []int{r % 2, r%2 + 2}, []int{r / 2 * 2, r/2*2 + 1}
		if !slices.Equal(ids(qs[r].Participants), wantParts) || !slices.Equal(ids(qs[r].Group), wantGroup) || ms[r].GroupComm() == nil {
			t.Errorf("rank %d: participants %v group %v, want %v and %v with a group communicator", r, ids(qs[r].Participants), ids(qs[r].Group), wantParts, wantGroup)
		}
	}
	// Rank 1 is lost: ranks 2 and 3 go on as a quorum of one group.
	s.Lost(1, 0, "test")
	for _, r := range []int{2, 3} {
		wg.Go(func() { qs[r], errs[r] = ms[r].Quorum(ctx) })
	}
	wg.Wait()
	for _, r := range []int{2, 3} {
		if errs[r] != nil || !slices.Equal(ids(qs[r].Participants), []int{r}) {
			t.Errorf("rank %d after rank 1's loss: participants %v (%v), want [%d]", r, ids(qs[r].Participants), errs[r], r)
		}
	}
	if rec := s.Record(); len(rec.Losses) != 2 {
		t.Errorf("losses %+v, want ranks 1 and 0 (its group)", rec.Losses)
	}
}

// joinGroups starts a service for n ranks in replica groups of size and
// joins every rank; the test's cleanup closes them, then the service.
func joinGroups(ctx context.Context, t *testing.T, n, size int) (*ft.Server, []*ft.Manager) {
	t.Helper()
	sec, _ := hex.DecodeString(secretHex())
	s, err := ft.NewServer(ft.ServerConfig{Addr: "127.0.0.1:0", JobID: "ftjob", Secret: sec, Replicas: n, GroupSize: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ms := make([]*ft.Manager, n)
	for r := range ms {
		env := replicaEnv(s, r, n, 0)
		env[ft.GroupSizeEnv] = strconv.Itoa(size)
		if ms[r], err = ft.Join(ctx, testConfig(env)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ms[r].Close() })
	}
	return s, ms
}

// trainOpen runs n replicas of the toy for steps committed steps against s
// and returns their managers still open (the caller closes them: a
// Close says bye, a Lost without one is a death).
func trainOpen(t *testing.T, s *ft.Server, n int, steps int64) []*ft.Manager {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ms := make([]*ft.Manager, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			m, err := ft.Join(ctx, testConfig(replicaEnv(s, r, n, 0)))
			if err != nil {
				errs[r] = err
				return
			}
			ms[r] = m
			errs[r] = train(ctx, m, newToy(100), steps, hooks{}, func(stepLog) {})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
	}
	return ms
}

// TestStateLive: the facts the launcher decides a replacement on. An
// incarnation holds the job's state once it committed a step; the state
// stays live while a live replica holds the last committed step, or once
// its holders finished; when every holder died, it is gone (a replacement
// would have nothing to heal from).
func TestStateLive(t *testing.T) {
	s := newServer(t, 2)
	if !s.StateLive() || s.HeldState(0, 0) {
		t.Fatalf("before any step: StateLive %v (want true: nothing to lose yet), HeldState %v (want false)", s.StateLive(), s.HeldState(0, 0))
	}
	ms := trainOpen(t, s, 2, 3)
	if !s.HeldState(0, 0) || !s.HeldState(1, 0) || s.HeldState(1, 1) {
		t.Errorf("after 3 commits: HeldState(0,0)=%v HeldState(1,0)=%v HeldState(1,1)=%v, want true true false",
			s.HeldState(0, 0), s.HeldState(1, 0), s.HeldState(1, 1))
	}
	s.Left(1, 0) // finished (gorun saw exit 0): its state counts
	if !s.StateLive() {
		t.Errorf("replica 0 still holds step 3, yet StateLive is false")
	}
	s.Lost(0, 0, "killed")
	if !s.StateLive() {
		t.Errorf("the other holder finished, yet StateLive is false (a late replacement is told ErrFinished)")
	}
	for _, m := range ms {
		_ = m.Close()
	}

	s2 := newServer(t, 2)
	ms = trainOpen(t, s2, 2, 3)
	s2.Lost(0, 0, "killed")
	s2.Lost(1, 0, "killed")
	if s2.StateLive() {
		t.Errorf("every holder of step 3 died, yet StateLive is true")
	}
	for _, m := range ms {
		_ = m.Close()
	}
}

// TestGroupCommFailsWhenPeerGivesUp: a replica group's member blocked in a
// group collective is released within moments when another member gives
// the quorum up (its connect failed, so it asks for a quorum again),
// instead of waiting for a call that member will never make; the next
// quorum rebuilds the group's communicator on every member and works.
func TestGroupCommFailsWhenPeerGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, ms := joinGroups(ctx, t, 2, 2)
	quorums := func(rs ...int) {
		t.Helper()
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Go(func() { _, errs[r] = ms[r].Quorum(ctx) })
		}
		wg.Wait()
		for _, r := range rs {
			if errs[r] != nil || ms[r].GroupComm() == nil {
				t.Fatalf("rank %d: quorum: %v (group communicator %v)", r, errs[r], ms[r].GroupComm())
			}
		}
	}
	quorums(0, 1)
	// Rank 0 enters the group's all-gather; rank 1 goes back to Quorum
	// without voting, as it does when building a communicator failed.
	gathered := make(chan error, 1)
	go func() {
		in, out := []float32{1}, make([]float32, 2)
		gathered <- ms[0].GroupComm().AllGather(ctx, comm.Float32s(in), comm.Float32s(out)).Wait(ctx)
	}()
	time.Sleep(100 * time.Millisecond) // rank 0 is in the call
	var wg sync.WaitGroup
	var q1 ft.Quorum
	var err1 error
	wg.Go(func() { q1, err1 = ms[1].Quorum(ctx) })
	start := time.Now()
	select {
	case err := <-gathered:
		if !errors.Is(err, ft.ErrQuorumFailed) {
			t.Errorf("rank 0's all-gather returned %v, want ft.ErrQuorumFailed", err)
		}
		t.Logf("rank 0 released %v after rank 1 gave the quorum up: %v", time.Since(start), err)
	case <-time.After(5 * time.Second):
		cancel() // release both, or the test waits for the bound
		wg.Wait()
		<-gathered
		t.Fatal("rank 0 still blocked in the group all-gather 5 s after rank 1 gave the quorum up")
	}
	ms[0].ReportError(errors.New("the group's all-gather failed"))
	if ok, err := ms[0].ShouldCommit(ctx); ok || err != nil {
		t.Fatalf("rank 0: ShouldCommit = %v, %v; want false, nil", ok, err)
	}
	quorums(0)
	wg.Wait()
	if err1 != nil {
		t.Fatalf("rank 1: quorum: %v", err1)
	}
	// Both rebuilt the group's communicator: an all-gather completes.
	outs := make([][]float32, 2)
	errs := make([]error, 2)
	for r := range ms {
		wg.Go(func() {
			outs[r] = make([]float32, 2)
			errs[r] = ms[r].GroupComm().AllGather(ctx, comm.Float32s([]float32{float32(r + 1)}), comm.Float32s(outs[r])).Wait(ctx)
		})
	}
	wg.Wait()
	for r := range ms {
		if errs[r] != nil || !slices.Equal(outs[r], []float32{1, 2}) {
			t.Errorf("rank %d: all-gather after the new quorum %d: %v %v, want [1 2]", r, q1.ID, outs[r], errs[r])
		}
	}
}

// TestNoVoteReleasesCollective: a replica whose step failed before a
// collective (its own error, reported) votes no and asks for the next
// quorum; a participant blocked in that collective, waiting for a call the
// first will never make, is released within moments (the service fails
// the quorum, not only the commit), and the next quorum works.
func TestNoVoteReleasesCollective(t *testing.T) {
	s := newServer(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ms := make([]*ft.Manager, 2)
	for r := range ms {
		var err error
		if ms[r], err = ft.Join(ctx, testConfig(replicaEnv(s, r, 2, 0))); err != nil {
			t.Fatal(err)
		}
		defer ms[r].Close()
	}
	quorums := func() {
		t.Helper()
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range ms {
			wg.Go(func() { _, errs[r] = ms[r].Quorum(ctx) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	quorums()
	reduced := make(chan error, 1)
	go func() { reduced <- ms[1].AllReduce(ctx, []float32{1}, comm.Sum) }()
	time.Sleep(100 * time.Millisecond) // replica 1 is in the call
	ms[0].ReportError(errors.New("the data loader broke"))
	if ok, err := ms[0].ShouldCommit(ctx); ok || err != nil {
		t.Fatalf("replica 0: ShouldCommit = %v, %v; want false, nil", ok, err)
	}
	var wg sync.WaitGroup
	var err0 error
	wg.Go(func() { _, err0 = ms[0].Quorum(ctx) })
	select {
	case err := <-reduced:
		if !errors.Is(err, ft.ErrQuorumFailed) {
			t.Errorf("replica 1's all-reduce returned %v, want ft.ErrQuorumFailed", err)
		}
	case <-time.After(5 * time.Second):
		cancel()
		wg.Wait()
		<-reduced
		t.Fatal("replica 1 still blocked in the all-reduce 5 s after replica 0 voted no and asked for the next quorum")
	}
	if ok, err := ms[1].ShouldCommit(ctx); ok || err != nil {
		t.Fatalf("replica 1: ShouldCommit = %v, %v; want false, nil", ok, err)
	}
	if _, err := ms[1].Quorum(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err0 != nil {
		t.Fatal(err0)
	}
	bufs := [][]float32{{1}, {2}}
	errs := make([]error, 2)
	for r := range ms {
		wg.Go(func() { errs[r] = ms[r].AllReduce(ctx, bufs[r], comm.Sum) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || bufs[0][0] != 3 || bufs[1][0] != 3 {
		t.Fatalf("all-reduce in the next quorum: %v %v", bufs, err)
	}
}
