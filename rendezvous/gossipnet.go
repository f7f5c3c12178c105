package rendezvous

import (
	"fmt"
	"log"
	"net"
	"strings"
	"sync"

	"github.com/hashicorp/memberlist"

	"github.com/gorun-hpc/gorun/internal/connlimit"
)

// Gossip's TCP listener is memberlist's own (NetTransport), which starts a
// goroutine with a read buffer for every connection it accepts and bounds
// only each connection's time (Config.TCPTimeout), not their number. An
// outsider holding thousands of connections would make every rank hold as
// many descriptors. boundedTransport is that same transport with its
// accepted streams counted by a connlimit.Gate: over the bound, a stream is
// closed before memberlist sees it. Memberlist's streams are short (a
// push-pull, a ping, a join), so the count covers their whole life.
//
// The bounds are wider than the data plane's: at formation every member
// joins through the seed at once, and a flat world of a few thousand
// members on one host comes from one address; a refused join is retried
// with backoff (form), so a bound costs time, never the world. Over a
// bound the oldest stream gives way to the new one (Evict): a member's
// streams last a round trip or two, while an outsider on a member's host,
// sharing its address, would otherwise hold that address's share (each
// held stream closed by memberlist after TCPTimeout and redialed) and keep
// the host's members out for as long as it liked.
var gossipStreamBounds = connlimit.Config{Max: 2048, PerSource: 1024, Evict: true}

type boundedTransport struct {
	*memberlist.NetTransport
	gate    *connlimit.Gate
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup // the forwarding goroutine
}

var _ memberlist.NodeAwareTransport = (*boundedTransport)(nil)

// newBoundedTransport binds memberlist's transport as memberlist.Create
// would (retrying an automatic port, which may be free for TCP and not for
// UDP), fills in the port it got when mc asked for any, and starts counting.
func newBoundedTransport(mc *memberlist.Config, logger *log.Logger) (*boundedTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: logger}
	tries := 1
	if mc.BindPort == 0 {
		tries = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("could not set up network transport: %w", err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		mc.AdvertisePort = mc.BindPort
	}
	gate, err := connlimit.New(gossipStreamBounds, nil)
	if err != nil {
		_ = nt.Shutdown()
		return nil, err
	}
	t := &boundedTransport{NetTransport: nt, gate: gate, streams: make(chan net.Conn), done: make(chan struct{})}
	t.wg.Go(t.forward)
	return t, nil
}

// forward hands memberlist the streams within the bounds.
func (t *boundedTransport) forward() {
	in := t.NetTransport.StreamCh()
	for {
		select {
		case <-t.done:
			return
		case c := <-in:
			release, ok := t.gate.Admit(c)
			if !ok {
				_ = c.Close()
				continue
			}
			select {
			case t.streams <- &countedConn{Conn: t.gate.Heard(c), release: release}:
			case <-t.done:
				release()
				_ = c.Close()
				return
			}
		}
	}
}

// StreamCh is memberlist's stream channel, bounded.
func (t *boundedTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the transport and the forwarding; idempotent (memberlist
// calls it once, and a failed Create leaves it to Join's cleanup).
func (t *boundedTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	t.once.Do(func() {
		close(t.done)
		t.gate.Close()
	})
	t.wg.Wait()
	return err
}

// countedConn gives its gate slot back when memberlist closes it.
type countedConn struct {
	net.Conn
	release func()
}

func (c *countedConn) Close() error {
	c.release()
	return c.Conn.Close()
}
