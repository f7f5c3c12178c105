package hostagent

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Doctor's agent side: its hello carries the GPU count Options.CountGPUs
// gives and a port that answers probes over TCP and UDP; asked to probe,
// it reports every other host, reached or not, and skips itself.
func TestDoctorAgentReportsAndProbes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	o := Options{Connect: ln.Addr().String(), Host: "n1", Job: "job1", Version: "v",
		CountGPUs: func(context.Context) int { return 3 }}
	go func() { errc <- serve(o, testKey, zerolog.Nop(), os.Stderr) }()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	w, _, err := wire.AcceptAuth(c, testKey, "job1", func(h string) bool { return h == "n1" })
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		w.Close()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("doctor agent: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the doctor agent did not return after gorun hung up")
		}
	}()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if err := w.Send(wire.Msg{T: "job", Job: &wire.Job{Version: "v", Doctor: true, Iface: "127.0.0.0/8"}}); err != nil {
		t.Fatal(err)
	}
	m, err := w.ReadMsg()
	if err != nil || m.T != "hello" || m.Hello == nil {
		t.Fatalf("hello: %+v %v", m, err)
	}
	h := m.Hello
	if h.Err != "" || h.GPUs != 3 || h.ProbePort == 0 || h.Program != "" || h.Addr == "" {
		t.Fatalf("doctor hello %+v, want no error, 3 GPUs, a probe port and no program", h)
	}
	self := net.JoinHostPort(h.Addr, strconv.Itoa(h.ProbePort))
	// A closed port: a host whose agent is not listening.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	peers := []wire.PeerAddr{{Host: "n1", Addr: self}, {Host: "n2", Addr: self}, {Host: "n3", Addr: deadAddr}}
	if err := w.Send(wire.Msg{T: "probe", Peers: peers}); err != nil {
		t.Fatal(err)
	}
	m, err = w.ReadMsg()
	if err != nil || m.T != "probed" {
		t.Fatalf("probe answer: %+v %v", m, err)
	}
	if _, ok := m.Probed["n1"]; ok || len(m.Probed) != 2 {
		t.Errorf("probed %v, want n2 and n3 only (not itself)", m.Probed)
	}
	if why, ok := m.Probed["n2"]; !ok || why != "" {
		t.Errorf("n2 (the agent's own probe port, TCP and UDP): %q, want reached", why)
	}
	if why := m.Probed["n3"]; !strings.HasPrefix(why, "tcp: ") {
		t.Errorf("n3 (nothing listening): %q, want a TCP failure", why)
	}
}
