package ft_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
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
