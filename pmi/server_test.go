package pmi

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProcessMapping(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
		err  bool
	}{
		{in: []int{4}, want: "(vector,(0,1,4))"},
		{in: []int{2, 2}, want: "(vector,(0,2,2))"},
		{in: []int{3, 3, 1}, want: "(vector,(0,2,3),(2,1,1))"},
		{in: []int{1, 2, 1}, want: "(vector,(0,1,1),(1,1,2),(2,1,1))"},
		{in: nil, err: true},
		{in: []int{2, 0}, err: true},
	} {
		got, err := ProcessMapping(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ProcessMapping(%v) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		cmd  string
		kv   map[string]string
		err  bool
	}{
		{line: "cmd=get_maxes", cmd: "get_maxes", kv: map[string]string{}},
		{line: "cmd=put kvsname=k key=a value=b=c", cmd: "put", kv: map[string]string{"kvsname": "k", "key": "a", "value": "b=c"}},
		{line: "", err: true},
		{line: "key=a cmd=put", err: true},
		{line: "cmd=put junk", err: true},
	} {
		m, err := parseLine(tc.line)
		if (err != nil) != tc.err {
			t.Errorf("parseLine(%q) error %v, want error %v", tc.line, err, tc.err)
			continue
		}
		if err == nil && (m.cmd != tc.cmd || !maps.Equal(m.fields, tc.kv)) {
			t.Errorf("parseLine(%q) = %q %v, want %q %v", tc.line, m.cmd, m.fields, tc.cmd, tc.kv)
		}
		if err != nil && !errors.Is(err, ErrProtocol) {
			t.Errorf("parseLine(%q) error %v does not wrap ErrProtocol", tc.line, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	for name, mut := range map[string]func(*Config){
		"kvs with space": func(c *Config) { c.KVSName = "a b" },
		"size 0":         func(c *Config) { c.Size = 0 },
		"no ranks":       func(c *Config) { c.Ranks = nil },
		"rank too big":   func(c *Config) { c.Ranks = []int{1} },
		"rank twice":     func(c *Config) { c.Size, c.Ranks = 2, []int{1, 1} },
	} {
		c := ok
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
}

// client speaks the client side the way MPICH's simple PMI does: one
// request line, one reply line.
type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (c *client) do(req string) string {
	c.t.Helper()
	if _, err := c.c.Write([]byte(req + "\n")); err != nil {
		c.t.Fatalf("write %q: %v", req, err)
	}
	line, err := c.br.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reply to %q: %v", req, err)
	}
	return strings.TrimSuffix(line, "\n")
}

// owner releases every fence of hosts at once with the union of their puts,
// as the launcher does, and records aborts.
func owner(servers []*Server, aborts chan<- Request) (stop func()) {
	var wg sync.WaitGroup
	fences := make(chan Request)
	for _, s := range servers {
		wg.Go(func() {
			for r := range s.Requests() {
				if r.Kind == Abort {
					aborts <- r
					continue
				}
				fences <- r
			}
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			union := map[string]string{}
			var epoch int
			for range servers {
				r, ok := <-fences
				if !ok {
					return
				}
				epoch = r.Epoch
				maps.Copy(union, r.Puts)
			}
			for _, s := range servers {
				_ = s.Release(epoch, union)
			}
		}
	}()
	return func() {
		for _, s := range servers {
			s.Close()
		}
		wg.Wait()
		close(fences)
		<-done
	}
}

// TestTwoHostsExchange runs MPICH's start-up sequence for 4 ranks on two
// servers (two hosts), one rank per host over PMI_FD-like pipes and one
// over the PMI_PORT handshake, and checks that every rank reads every
// other rank's put after the barrier.
func TestTwoHostsExchange(t *testing.T) {
	mapping, _ := ProcessMapping([]int{2, 2})
	var servers []*Server
	for h := range 2 {
		s, err := NewServer(Config{KVSName: "gorun-j", Size: 4, Ranks: []int{2 * h, 2*h + 1}, ProcessMapping: mapping})
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, s)
	}
	aborts := make(chan Request, 4)
	stop := owner(servers, aborts)
	defer stop()
	addr, err := servers[1].Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	var wg, serveWG sync.WaitGroup
	var ends []net.Conn
	errs := make(chan error, 8)
	for rank := range 4 {
		var cl *client
		s := servers[rank/2]
		if rank == 3 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cl = &client{t: t, c: c, br: bufio.NewReader(c)}
			fmt.Fprintf(c, "cmd=initack pmiid=%d\n", s.ID(3))
			var got []string
			for range 4 {
				l, _ := cl.br.ReadString('\n')
				got = append(got, strings.TrimSpace(l))
			}
			if want := "cmd=initack|cmd=set size=4|cmd=set rank=3|cmd=set debug=0"; strings.Join(got, "|") != want {
				t.Fatalf("port handshake %q, want %q", strings.Join(got, "|"), want)
			}
		} else {
			a, b := net.Pipe()
			ends = append(ends, a)
			serveWG.Go(func() {
				if err := s.ServeConn(rank, b); err != nil {
					errs <- err
				}
			})
			cl = &client{t: t, c: a, br: bufio.NewReader(a)}
		}
		wg.Go(func() {
			steps := []struct{ req, want string }{
				{"cmd=init pmi_version=1 pmi_subversion=1", "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"},
				{"cmd=get_maxes", "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0"},
				{"cmd=get_appnum", "cmd=appnum appnum=0 rc=0"},
				{"cmd=get_my_kvsname", "cmd=my_kvsname kvsname=gorun-j rc=0"},
				{"cmd=get kvsname=gorun-j key=PMI_process_mapping", "cmd=get_result rc=0 msg=success value=(vector,(0,2,2))"},
				{fmt.Sprintf("cmd=put kvsname=gorun-j key=card-%d value=addr%d", rank, rank), "cmd=put_result rc=0 msg=success"},
				{"cmd=barrier_in", "cmd=barrier_out"},
			}
			for other := range 4 {
				steps = append(steps, struct{ req, want string }{
					fmt.Sprintf("cmd=get kvsname=gorun-j key=card-%d", other),
					fmt.Sprintf("cmd=get_result rc=0 msg=success value=addr%d", other)})
			}
			steps = append(steps,
				struct{ req, want string }{"cmd=get kvsname=gorun-j key=nope", "cmd=get_result rc=-1 msg=key_nope_not_found"},
				struct{ req, want string }{"cmd=barrier_in", "cmd=barrier_out"},
				struct{ req, want string }{"cmd=finalize", "cmd=finalize_ack"})
			for _, st := range steps {
				if got := cl.do(st.req); got != st.want {
					errs <- fmt.Errorf("rank %d: %q → %q, want %q", rank, st.req, got, st.want)
					return
				}
			}
		})
	}
	waitOrFail(t, &wg)
	// The clients hang up as MPICH does after finalize: every server
	// goroutine then ends on EOF.
	for _, a := range ends {
		a.Close()
	}
	waitOrFail(t, &serveWG)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for rank := range 4 {
		if in, fin := servers[rank/2].State(rank); !in || !fin {
			t.Errorf("rank %d state init=%v finalize=%v, want both", rank, in, fin)
		}
	}
}

// TestAbortAndClose: an abort reaches the owner with its code, the
// aborting rank gets no reply, and Close lets a rank waiting in a barrier
// (its peer is gone) go without an answer instead of hanging.
func TestAbortAndClose(t *testing.T) {
	s, err := NewServer(Config{KVSName: "k", Size: 2, Ranks: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	a0, b0 := net.Pipe()
	a1, b1 := net.Pipe()
	defer a0.Close()
	defer a1.Close()
	wg.Go(func() { _ = s.ServeConn(0, b0) })
	wg.Go(func() { _ = s.ServeConn(1, b1) })
	c0 := &client{t: t, c: a0, br: bufio.NewReader(a0)}
	c0.do("cmd=init pmi_version=1 pmi_subversion=1")
	if _, err := a0.Write([]byte("cmd=barrier_in\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := a1.Write([]byte("cmd=abort exitcode=7\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-s.Requests():
		if r.Kind != Abort || r.Rank != 1 || r.Code != 7 {
			t.Fatalf("request %+v, want abort of rank 1 with code 7", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no abort request")
	}
	if err := s.Release(0, nil); err == nil {
		t.Error("Release of a barrier only one of two ranks entered succeeded")
	}
	s.Close()
	waitOrFail(t, &wg)
	if in, fin := s.State(0); !in || fin {
		t.Errorf("rank 0 init=%v finalize=%v, want init only", in, fin)
	}
}

// TestRefusals: a second connection for a rank, an unknown PMI version and a
// stranger's pmiid are refused with an answer, not served.
func TestRefusals(t *testing.T) {
	s, err := NewServer(Config{KVSName: "k", Size: 1, Ranks: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "cmd=initack pmiid=%d\n", s.ID(0)+1)
	if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
		t.Error("a wrong pmiid got an answer")
	}
	c.Close()

	a, b := net.Pipe()
	defer a.Close()
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.ServeConn(0, b) })
	cl := &client{t: t, c: a, br: bufio.NewReader(a)}
	if got := cl.do("cmd=init pmi_version=3 pmi_subversion=0"); !strings.Contains(got, "rc=-1") {
		t.Errorf("PMI-3 init answered %q, want rc=-1", got)
	}
	if got := cl.do("cmd=frobnicate"); !strings.Contains(got, "rc=-1") {
		t.Errorf("unknown command answered %q, want rc=-1", got)
	}
	if got := cl.do("cmd=put kvsname=other key=a value=b"); !strings.Contains(got, "rc=-1") {
		t.Errorf("put to a foreign kvs answered %q, want rc=-1", got)
	}
	a2, b2 := net.Pipe()
	defer a2.Close()
	if err := s.ServeConn(0, b2); err == nil {
		t.Error("a second connection for rank 0 was served")
	}
	a.Close()
	waitOrFail(t, &wg)
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		t.Log(string(buf[:runtime.Stack(buf, true)]))
		t.Fatal("timed out: a PMI exchange hangs")
	}
}

func TestFrame2(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []pair
		err  bool
	}{
		{body: "cmd=kvs-put;key=k;value=a;;b c;", want: []pair{{"cmd", "kvs-put"}, {"key", "k"}, {"value", "a;b c"}}},
		{body: "cmd=finalize;", want: []pair{{"cmd", "finalize"}}},
		{body: "cmd=x;key=unended", err: true},
		{body: "=v;", err: true},
	} {
		got, err := parseFrame2(tc.body)
		if (err != nil) != tc.err || (err == nil && fmt.Sprint(got) != fmt.Sprint(tc.want)) {
			t.Errorf("parseFrame2(%q) = %v, %v; want %v, error %v", tc.body, got, err, tc.want, tc.err)
		}
	}
	// A value with ';' survives a round trip, and the length field counts
	// the escaped body.
	f := formatFrame2("cmd", "kvs-get-response", "value", "x;y")
	if f != "32    cmd=kvs-get-response;value=x;;y;" {
		t.Errorf("formatFrame2 = %q", f)
	}
	ps, err := readFrame2(bufio.NewReader(strings.NewReader(f)))
	if err != nil || fmt.Sprint(ps) != fmt.Sprint([]pair{{"cmd", "kvs-get-response"}, {"value", "x;y"}}) {
		t.Errorf("readFrame2(%q) = %v, %v", f, ps, err)
	}
}
