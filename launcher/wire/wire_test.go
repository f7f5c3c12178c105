package wire

import (
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// A frame of each kind crosses a connection intact, and ReadMsg skips
// pings to the next message.
func TestFramesRoundTrip(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	wa, wb := NewConn(a, nil), NewConn(b, nil)
	wa.SetWriteTimeout(5 * time.Second)
	errc := make(chan error, 1)
	go func() {
		for _, f := range []func() error{
			func() error { return wa.WriteFrame(FramePing) },
			func() error { return wa.Send(Msg{T: "hello", Hello: &Hello{Version: "v1", MasterPort: 29500}}) },
			func() error { return wa.SendOutput(7, 2, []byte("line\n")) },
		} {
			if err := f(); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	m, err := wb.ReadMsg()
	if err != nil || m.T != "hello" || m.Hello == nil || m.Hello.Version != "v1" || m.Hello.MasterPort != 29500 {
		t.Fatalf("ReadMsg = %+v, %v", m, err)
	}
	typ, p, err := wb.ReadFrame(nil)
	if err != nil || typ != FrameOutput || len(p) != 5+5 || p[3] != 7 || p[4] != 2 || string(p[5:]) != "line\n" {
		t.Fatalf("output frame = %q %q, %v", typ, p, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// A peer announcing a frame over MaxFrame is refused before anything is
// allocated for it.
func TestFrameOverLimitRefused(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _, _ = a.Write([]byte{FrameMsg, 0xff, 0xff, 0xff, 0xff}) }()
	if _, _, err := NewConn(b, nil).ReadFrame(nil); err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Fatalf("oversized frame: %v", err)
	}
}

// The JSON names are the wire format older and newer peers read: a
// rename here is a new Protocol.
func TestMessageNames(t *testing.T) {
	gpu := 1
	for _, c := range []struct {
		v    any
		want string
	}{
		{Msg{T: "spec", Ranks: []HostRank{{Rank: 3, Env: []string{"A=1"}, GPU: &gpu}}, PMI: &PMIJob{KVSName: "k", Size: 4, Mapping: "m"}},
			`{"t":"spec","ranks":[{"rank":3,"env":["A=1"],"gpu":1}],"pmi":{"kvs":"k","size":4,"mapping":"m"}}`},
		{Cmd{Op: "signal", Signal: 15, Ranks: []int{0, 1}, DumpFirst: true}, `{"op":"signal","signal":15,"ranks":[0,1],"dump_first":true}`},
		// Node is gorun's own bookkeeping: never sent.
		{Event{Ev: "exited", Rank: 2, Code: 3, Node: 5}, `{"ev":"exited","rank":2,"code":3}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil || string(b) != c.want {
			t.Errorf("%T = %s, %v; want %s", c.v, b, err, c.want)
		}
	}
}

// An agent that proves the secret but claims another protocol is a
// *ProtocolError naming its host; with the wrong secret, the agent finds
// gorun's proof wrong (ErrAuth) and gorun has a *HandshakeError.
func TestAcceptAuthVerdicts(t *testing.T) {
	secret := []byte("s")
	known := func(h string) bool { return h == "n1" }
	var agentErr error
	try := func(agentSecret []byte, proto string) (*Conn, string, error) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, agentErr = DialAuthAs(a, agentSecret, "job1", "n1", proto)
			a.Close()
		}()
		w, host, err := AcceptAuth(b, secret, "job1", known)
		b.Close()
		<-done
		return w, host, err
	}
	if w, host, err := try(secret, Protocol); err != nil || w == nil || host != "n1" {
		t.Fatalf("right secret and protocol: %v host %q", err, host)
	}
	var pe *ProtocolError
	if _, host, err := try(secret, "9"); !errors.As(err, &pe) || host != "n1" || pe.Remote != "9" || pe.Local != Protocol {
		t.Fatalf("foreign protocol: %v host %q, want a *ProtocolError for n1", err, host)
	}
	var he *HandshakeError
	if _, host, err := try([]byte("wrong"), Protocol); !errors.As(err, &he) || host != "" || !errors.Is(agentErr, ErrAuth) {
		t.Fatalf("wrong secret: gorun %v host %q, agent %v; want a *HandshakeError and ErrAuth", err, host, agentErr)
	}
}
