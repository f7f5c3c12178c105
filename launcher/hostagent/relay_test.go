package hostagent

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// fakeGorun is gorun's end of one agent's connection, driven by a test.
type fakeGorun struct {
	t    *testing.T
	w    *wire.Conn
	errc chan error // serve's result, once
	err  error      // serve's result, once wait read it
	done bool
}

// wait returns serve's result, within d.
func (g *fakeGorun) wait(d time.Duration) (error, bool) {
	if !g.done {
		select {
		case g.err = <-g.errc:
			g.done = true
		case <-time.After(d):
			return nil, false
		}
	}
	return g.err, true
}

var testKey = []byte("0123456789abcdef0123456789abcdef")

// startAgent runs serve against a listener the test accepts on, sends
// job, and returns once the agent's hello came (which must be clean).
func startAgent(t *testing.T, job wire.Job) *fakeGorun {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g := &fakeGorun{t: t, errc: make(chan error, 1)}
	o := Options{Connect: ln.Addr().String(), Host: "n1", Job: "job1", Version: "v"}
	go func() { g.errc <- serve(o, testKey, zerolog.Nop(), os.Stderr) }()
	t.Cleanup(func() {
		// Whatever the test did, the agent ends once gorun hangs up.
		if g.w != nil {
			g.w.Close()
		}
		if _, ok := g.wait(20 * time.Second); !ok {
			t.Error("the agent did not return after gorun hung up")
		}
	})
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	w, host, err := wire.AcceptAuth(c, testKey, "job1", func(h string) bool { return h == "n1" })
	if err != nil || host != "n1" {
		t.Fatalf("accept the agent: %v (host %q)", err, host)
	}
	g.w = w
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	job.Version, job.Program, job.Iface, job.Ranks, job.NoPMI = "v", exe, "127.0.0.0/8", 1, true
	job.Grace, job.LogLevel = time.Second, int8(zerolog.WarnLevel)
	if err := w.Send(wire.Msg{T: "job", Job: &job}); err != nil {
		t.Fatal(err)
	}
	m, err := w.ReadMsg()
	if err != nil || m.T != "hello" || m.Hello == nil || m.Hello.Err != "" {
		t.Fatalf("hello: %+v %v", m.Hello, err)
	}
	return g
}

// spec starts one rank, rank 0, in the given mode of the test binary.
func (g *fakeGorun) spec(mode string) {
	g.t.Helper()
	env := []string{rankModeEnv + "=" + mode, rankenv.JobID + "=hostagent-test-" + mode}
	if err := g.w.Send(wire.Msg{T: "spec", Ranks: []wire.HostRank{{Rank: 0, Env: env}}}); err != nil {
		g.t.Fatal(err)
	}
}

// next reads the connection until an event arrives, collecting rank 0's
// stdout on the way.
func (g *fakeGorun) next(stdout *strings.Builder) (wire.Event, error) {
	for {
		typ, p, err := g.w.ReadFrame(nil)
		if err != nil {
			return wire.Event{}, err
		}
		switch typ {
		case wire.FrameOutput:
			if p[4] == 1 {
				stdout.Write(p[5:])
			}
		case wire.FrameMsg:
			var m wire.Msg
			if err := json.Unmarshal(p, &m); err != nil {
				return wire.Event{}, err
			}
			if m.T == "event" && m.Event != nil {
				return *m.Event, nil
			}
			if m.T == "supervisor-lost" {
				return wire.Event{}, errors.New(m.Err)
			}
		}
	}
}

// A rank's run through the agent: its output, its exit, then — before
// "done" — the flight record it left, with the content it wrote, and the
// agent removes its flight directory once gorun hangs up.
func TestAgentRelaysOutputThenFlightThenDone(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	g := startAgent(t, wire.Job{Lease: 4 * time.Second, Flight: true})
	g.spec("flight")
	var out strings.Builder
	var evs []string
	var got []comm.FlightDump
	pid := 0
	for {
		ev, err := g.next(&out)
		if err != nil {
			t.Fatalf("after %v: %v", evs, err)
		}
		evs = append(evs, ev.Ev)
		if ev.Ev == "started" {
			pid = ev.PID
		}
		if ev.Ev == "exited" && (ev.Code != 0 || ev.Signal != 0) {
			t.Errorf("the rank exited with %+v", ev)
		}
		if ev.Ev == "flight" && ev.Flight != nil {
			got = append(got, *ev.Flight)
		}
		if ev.Ev == "done" {
			break
		}
	}
	if out.String() != "hello from the rank\n" {
		t.Errorf("rank 0's stdout %q", out.String())
	}
	if len(got) != 1 {
		t.Fatalf("events %v: %d flight records before done, want 1", evs, len(got))
	}
	want := testDump(pid)
	want.Records = []comm.FlightRecord{}
	if got[0].Records == nil {
		got[0].Records = []comm.FlightRecord{}
	}
	gj, _ := json.Marshal(got[0])
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Errorf("flight record\n got %s\nwant %s", gj, wj)
	}
	g.w.Close()
	if err, ok := g.wait(20 * time.Second); !ok || err != nil {
		t.Errorf("serve after a clean job: %v (returned: %v)", err, ok)
	}
	if left, _ := os.ReadDir(os.Getenv("TMPDIR")); len(left) != 0 {
		t.Errorf("the agent left %v in its temporary directory", left[0].Name())
	}
}

// gorun falling silent past the lease (a cut link delivers no FIN, so the
// connection stays open) ends the job on the host: the agent kills its
// ranks and says why.
func TestAgentLeaseKillsRanksWhenGorunFallsSilent(t *testing.T) {
	const lease = time.Second
	g := startAgent(t, wire.Job{Lease: lease})
	g.spec("hang")
	var out strings.Builder
	ev, err := g.next(&out)
	if err != nil || ev.Ev != "started" || ev.PID <= 0 {
		t.Fatalf("first event %+v, %v; want started", ev, err)
	}
	start := time.Now()
	// From here gorun reads nothing and sends nothing.
	serveErr, ok := g.wait(10 * lease)
	if !ok {
		t.Fatalf("the agent still runs %v after gorun fell silent (lease %v)", time.Since(start), lease)
	}
	if serveErr == nil || !strings.Contains(serveErr.Error(), "no word from gorun") {
		t.Errorf("serve = %v, want a lease expiry", serveErr)
	}
	if e := time.Since(start); e < lease {
		t.Errorf("the agent gave up after %v, before the lease of %v", e, lease)
	}
	if err := syscall.Kill(ev.PID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("rank pid %d still exists after the agent returned (kill 0: %v)", ev.PID, err)
	}
}
