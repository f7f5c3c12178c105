package hostagent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// doctor is `gorun doctor`'s agent side (launcher.Doctor is gorun's):
// report, answer probes, probe every other host.
func doctor(o Options, job *wire.Job, w *wire.Conn) error {
	h, reserved := prepareHost(o, &wire.Job{Program: "/bin/sh", Iface: job.Iface}, w.NetConn(), false)
	reserved.Release()
	h.Program = ""
	if o.CountGPUs != nil {
		h.GPUs = o.CountGPUs(context.Background())
	}
	h.Cgroup = supervisor.CgroupStatus()
	var tl net.Listener
	var ul net.PacketConn
	if h.Err == "" {
		var err error
		tl, ul, err = probeListeners(h.Addr)
		if err != nil {
			h.Err, h.ErrKind = err.Error(), "ports"
		} else {
			h.ProbePort = tl.Addr().(*net.TCPAddr).Port
			var served sync.WaitGroup
			defer served.Wait()
			defer tl.Close() // before the wait: ends serveProbes
			defer ul.Close()
			served.Go(func() { serveProbes(tl, ul) })
		}
	}
	if err := w.Send(wire.Msg{T: "hello", Hello: &h}); err != nil {
		return err
	}
	_ = w.NetConn().SetDeadline(time.Time{})
	m, err := w.ReadMsg()
	if err != nil || m.T != "probe" {
		return nil
	}
	res := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range m.Peers {
		if p.Host == o.Host {
			continue
		}
		wg.Go(func() {
			why := probe(p.Addr)
			mu.Lock()
			res[p.Host] = why
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := w.Send(wire.Msg{T: "probed", Probed: res}); err != nil {
		return err
	}
	_, _ = w.ReadMsg() // until gorun hangs up
	return nil
}

// probeListeners opens TCP and UDP on one port of addr.
func probeListeners(addr string) (net.Listener, net.PacketConn, error) {
	for range 20 {
		tl, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			return nil, nil, err
		}
		ul, err := net.ListenPacket("udp", tl.Addr().String())
		if err == nil {
			return tl, ul, nil
		}
		tl.Close()
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, err
		}
	}
	return nil, nil, errors.New("no port free for both TCP and UDP")
}

// serveProbes answers TCP connections with "gorun\n" and echoes UDP
// datagrams, until the listeners close; it returns once both ended.
func serveProbes(tl net.Listener, ul net.PacketConn) {
	var udp sync.WaitGroup
	defer udp.Wait()
	udp.Go(func() {
		buf := make([]byte, 64)
		for {
			n, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = ul.WriteTo(buf[:n], from)
		}
	})
	for {
		c, err := tl.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("gorun\n"))
		c.Close()
	}
}

// probe checks addr over TCP and UDP (a few tries, as UDP may drop).
func probe(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "tcp: " + err.Error()
	}
	c.Close()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return err.Error()
	}
	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return "udp: " + err.Error()
	}
	defer u.Close()
	buf := make([]byte, 64)
	for range 5 {
		_, _ = u.Write([]byte("gorun-probe"))
		_ = u.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := u.Read(buf); err == nil && string(buf[:n]) == "gorun-probe" {
			return ""
		}
	}
	return "udp: no echo"
}
