package rank

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a fake environment for one rank.
type env map[string]string

func (e env) look(k string) (string, bool) { v, ok := e[k]; return v, ok }

func testOptions(t *testing.T, e env) Options {
	o := DefaultOptions()
	o.Lookup = e.look
	o.Comm = comm.LocalConfig()
	o.Rendezvous = func(c *rendezvous.Config) {
		c.FormationTimeout = 20 * time.Second
		c.LeaveLinger = 10 * time.Millisecond
	}
	return o
}

func TestAlone(t *testing.T) {
	ctx := context.Background()
	r, err := Init(ctx, testOptions(t, env{}))
	if err != nil {
		t.Fatal(err)
	}
	if r.Source() != SourceAlone || r.Rank() != 0 || r.Size() != 1 || r.World() != nil {
		t.Fatalf("alone: source %q rank %d size %d world %v", r.Source(), r.Rank(), r.Size(), r.World())
	}
	if !strings.HasPrefix(r.Endpoint().Addr(), "127.0.0.1:") {
		t.Errorf("alone: data plane on %s, want loopback", r.Endpoint().Addr())
	}
	v := []float64{3}
	if err := r.Comm().AllReduce(ctx, comm.Float64s(v), comm.Float64s(v), comm.Sum).Wait(ctx); err != nil || v[0] != 3 {
		t.Fatalf("all-reduce alone: %v %v", v, err)
	}
	g, err := r.Group([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := r.NewComm(ctx, g, "sub")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Barrier(ctx).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Group([]int{0, 1}); !errors.Is(err, ErrConfig) {
		t.Errorf("group [0 1] alone: %v, want ErrConfig", err)
	}
	if g, err := r.Split(ctx, rendezvous.Undefined, 0); g != nil || err != nil {
		t.Errorf("split undefined: %v %v", g, err)
	}
	if m := r.Members(); len(m) != 1 || m[0].DataAddr != r.Endpoint().Addr() {
		t.Errorf("members %+v", m)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := r.NewComm(ctx, g, "late"); !errors.Is(err, ErrClosed) {
		t.Errorf("NewComm after Close: %v, want ErrClosed", err)
	}
	if err := sub.Barrier(ctx).Wait(ctx); err == nil {
		t.Error("a communicator from NewComm still works after Close")
	}
}

func TestRequireLauncher(t *testing.T) {
	o := testOptions(t, env{})
	o.RequireLauncher = true
	if _, err := Init(context.Background(), o); !errors.Is(err, ErrNotLaunched) {
		t.Fatalf("got %v, want ErrNotLaunched", err)
	}
}

// Bad environments fail before anything is opened, naming the variable.
func TestBadEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    env
		want string
	}{
		{"rank without size", env{"RANK": "0"}, "RANK is set but WORLD_SIZE is not"},
		{"size without rank", env{"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"},
		{"gorun half", env{"GORUN_RANK": "1"}, "GORUN_RANK is set but GORUN_WORLD_SIZE is not"},
		{"slurm half", env{"SLURM_PROCID": "1"}, "SLURM_PROCID is set but SLURM_NTASKS is not"},
		{"not a number", env{"GORUN_RANK": "x", "GORUN_WORLD_SIZE": "2", "GORUN_SECRET": "00"}, "GORUN_RANK"},
		{"rank out of range", env{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "Rank"},
		{"gorun without secret", env{"GORUN_RANK": "0", "GORUN_WORLD_SIZE": "1"}, "GORUN_SECRET"},
		{"srun without job", env{"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, "SLURM_JOB_ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Init(context.Background(), testOptions(t, tc.e))
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrConfig naming %q", err, tc.want)
			}
		})
	}
}

func TestBadOptions(t *testing.T) {
	o := testOptions(t, env{})
	o.Comm.QueueDepth = -1
	if _, err := Init(context.Background(), o); !errors.Is(err, ErrConfig) {
		t.Errorf("bad Comm: %v", err)
	}
	o = testOptions(t, env{})
	o.Endpoint.ShmRingBytes = 3
	if _, err := Init(context.Background(), o); !errors.Is(err, ErrConfig) {
		t.Errorf("bad Endpoint: %v", err)
	}
	o = testOptions(t, env{})
	o.Iface = "no-such-interface0"
	_, err := Init(context.Background(), o)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no-such-interface0") {
		t.Errorf("bad Iface: %v", err)
	}
}

// The address policy, case by case (what can be checked without a second
// interface: the route-to-seed case is the multi-host tests').
func TestListenAddr(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, user, iface, seed string
		want                    string // prefix
		err                     bool
	}{
		{"given", "10.1.2.3:7", "", "192.0.2.1:5", "10.1.2.3:7", false},
		{"alone", "", "", "", "127.0.0.1:0", false},
		{"loopback seed", "", "", "127.0.0.1:5000", "127.0.0.1:0", false},
		{"localhost seed", "", "", "localhost:5000", "127.0.0.1:0", false},
		{"iface lo", "", "lo", "192.0.2.1:5", "127.0.0.1:0", false},
		{"iface cidr", "", "127.0.0.0/8", "", "127.0.0.1:0", false},
		{"bad seed", "", "", "no-port", "", true},
		{"bad iface", "", "nope0", "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := listenAddr(ctx, tc.user, tc.iface, tc.seed)
			if tc.err {
				if err == nil {
					t.Fatalf("got %s (%s), want an error", got, why)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q %v, want %q", got, err, tc.want)
			}
		})
	}
}

// startWorld runs Init on n ranks in this process, rank r with envOf(r),
// and returns them in rank order.
func startWorld(t *testing.T, n int, envOf func(r int) env) []*Rank {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ranks := make([]*Rank, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { ranks[r], errs[r] = Init(ctx, testOptions(t, envOf(r))) })
	}
	wg.Wait()
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, r := range ranks {
			if r != nil {
				wg.Go(func() { _ = r.Close() })
			}
		}
		wg.Wait()
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return ranks
}

// onEach runs f on every rank concurrently and fails on the first error.
func onEach(t *testing.T, ranks []*Rank, f func(r *Rank) error) {
	t.Helper()
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { errs[i] = f(r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

const secret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

// Every launcher's environment forms one world whose communicators work,
// world and subgroups, and Close closes them all.
func TestWorld(t *testing.T) {
	const n = 3
	for _, tc := range []struct {
		name   string
		source string
		env    func(t *testing.T) func(r int) env
	}{
		{"gorun", SourceGorun, func(t *testing.T) func(int) env {
			seed := rendezvoustest.FreeSeed(t)
			return func(r int) env {
				return env{"GORUN_RANK": strconv.Itoa(r), "GORUN_WORLD_SIZE": strconv.Itoa(n), "GORUN_JOB_ID": "rank-test-gorun",
					"GORUN_RDZV_ENDPOINT": seed, "GORUN_SECRET": secret, "GORUN_RDZV_FLAT": "1"}
			}
		}},
		{"gorun host leaders", SourceGorun, func(t *testing.T) func(int) env {
			seed := rendezvoustest.FreeSeed(t)
			job := fmt.Sprintf("rank-hl-%d", time.Now().UnixNano())
			return func(r int) env {
				return env{"GORUN_RANK": strconv.Itoa(r), "GORUN_WORLD_SIZE": strconv.Itoa(n), "GORUN_JOB_ID": job,
					"GORUN_LOCAL_RANK": strconv.Itoa(r), "GORUN_LOCAL_WORLD_SIZE": strconv.Itoa(n), "GORUN_HOST": "h0",
					"GORUN_RDZV_ENDPOINT": seed, "GORUN_SECRET": secret}
			}
		}},
		{"torch", SourceTorch, func(t *testing.T) func(int) env {
			port := strconv.Itoa(rendezvoustest.FreePort(t))
			return func(r int) env {
				return env{"RANK": strconv.Itoa(r), "WORLD_SIZE": strconv.Itoa(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
			}
		}},
		{"srun", SourceSlurm, func(t *testing.T) func(int) env {
			port := strconv.Itoa(rendezvoustest.FreePort(t))
			job := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
			return func(r int) env {
				return env{"SLURM_PROCID": strconv.Itoa(r), "SLURM_NTASKS": strconv.Itoa(n), "SLURM_JOB_ID": job,
					"SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost", "GORUN_RDZV_PORT": port, "GORUN_RDZV_FLAT": "1"}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ranks := startWorld(t, n, tc.env(t))
			for i, r := range ranks {
				if r.Rank() != i || r.Size() != n || r.Source() != tc.source || r.World() == nil {
					t.Fatalf("rank %d: rank %d size %d source %q", i, r.Rank(), r.Size(), r.Source())
				}
				if m := r.Members(); len(m) != n || m[i].DataAddr != r.Endpoint().Addr() {
					t.Fatalf("rank %d: members %+v", i, m)
				}
				if !strings.HasPrefix(r.Endpoint().Addr(), "127.0.0.1:") {
					t.Errorf("rank %d: data plane on %s, want loopback (the seed is)", i, r.Endpoint().Addr())
				}
			}
			// World all-reduce: 0+1+2.
			onEach(t, ranks, func(r *Rank) error {
				v := []float64{float64(r.Rank())}
				if err := r.Comm().AllReduce(ctx, comm.Float64s(v), comm.Float64s(v), comm.Sum).Wait(ctx); err != nil {
					return err
				}
				if v[0] != 3 {
					return fmt.Errorf("rank %d: sum %v, want 3", r.Rank(), v[0])
				}
				return nil
			})
			// A subgroup of ranks 2 and 0 (in that order) with its own
			// communicator; rank 1 stays out.
			onEach(t, ranks, func(r *Rank) error {
				if r.Rank() == 1 {
					return nil
				}
				g, err := r.Group([]int{2, 0})
				if err != nil {
					return err
				}
				c, err := r.NewComm(ctx, g, "pair")
				if err != nil {
					return err
				}
				v := []int64{int64(10 * (r.Rank() + 1))}
				all := make([]int64, 2)
				if err := c.AllGather(ctx, comm.Int64s(v), comm.Int64s(all)).Wait(ctx); err != nil {
					return err
				}
				if all[0] != 30 || all[1] != 10 {
					return fmt.Errorf("rank %d: pair all-gather %v, want [30 10]", r.Rank(), all)
				}
				return nil
			})
			// Split by parity, collectively.
			onEach(t, ranks, func(r *Rank) error {
				g, err := r.Split(ctx, r.Rank()%2, r.Rank())
				if err != nil {
					return err
				}
				if want := []int{2, 1, 2}[r.Rank()]; g.Size() != want {
					return fmt.Errorf("rank %d: split group of %d, want %d", r.Rank(), g.Size(), want)
				}
				_, err = r.NewComm(ctx, g, "parity")
				return err
			})
			onEach(t, ranks, func(r *Rank) error { return r.Close() })
			onEach(t, ranks, func(r *Rank) error { return r.Close() }) // idempotent
		})
	}
}

// A rank whose launcher gave another secret derives another data-plane key
// and is refused by the others: the key is the secret's, derived before Join.
func TestDataPlaneKeyFromSecret(t *testing.T) {
	c := rendezvous.DefaultConfig()
	c.JobID, c.Secret = "j", []byte("0123456789abcdef0123456789abcdef")
	k1, err := c.DeriveKey(DataPlanePurpose)
	if err != nil {
		t.Fatal(err)
	}
	c2 := c
	c2.Secret = []byte("fedcba9876543210fedcba9876543210")
	k2, _ := c2.DeriveKey(DataPlanePurpose)
	if len(k1) != 32 || string(k1) == string(k2) || string(k1) == string(c.Secret) {
		t.Fatal("the data-plane key must be 32 bytes, depend on the secret and differ from it")
	}
	// Two endpoints with keys from different secrets cannot connect.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	eps := make([]*comm.Endpoint, 2)
	for i, k := range [][]byte{k1, k2} {
		ecfg := comm.DefaultEndpointConfig()
		ecfg.Addr, ecfg.Secret = "127.0.0.1:0", k
		if eps[i], err = comm.Listen(ecfg); err != nil {
			t.Fatal(err)
		}
		defer eps[i].Close()
	}
	addrs := []string{eps[0].Addr(), eps[1].Addr()}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			cfg := comm.LocalConfig()
			cfg.ConnectTimeout = 2 * time.Second
			c, err := comm.New(ctx, comm.NewStaticGroup(i, addrs, nil), eps[i], cfg)
			if err == nil {
				_ = c.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if errs[0] == nil && errs[1] == nil {
		t.Fatal("endpoints with keys from different secrets connected")
	}
}

// A communicator closed through CloseComm reports its failure there, once:
// the rank's Close neither closes it again nor reports it, while one that
// is still open at Close is reported by Close.
func TestCloseCommReportsOnce(t *testing.T) {
	ctx := context.Background()
	r, err := Init(ctx, testOptions(t, env{}))
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.Group([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	freed, err := r.NewComm(ctx, g, "freed")
	if err != nil {
		t.Fatal(err)
	}
	open, err := r.NewComm(ctx, g, "open")
	if err != nil {
		t.Fatal(err)
	}
	why1, why2 := errors.New("first group timed out"), errors.New("second group timed out")
	freed.Abort(why1)
	open.Abort(why2)
	if err := r.CloseComm(freed); !errors.Is(err, why1) {
		t.Errorf("CloseComm of an aborted communicator: %v, want its cause", err)
	}
	err = r.Close()
	if errors.Is(err, why1) {
		t.Errorf("Close reported the failure of a communicator CloseComm released: %v", err)
	}
	if !errors.Is(err, why2) {
		t.Errorf("Close: %v, want the failure of the communicator still open", err)
	}
}
