package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// metaDelegate gives a memberlist node metadata of a rendezvous member's
// size and nothing else.
type metaDelegate struct{ meta []byte }

func (d metaDelegate) NodeMeta(int) []byte               { return d.meta }
func (d metaDelegate) NotifyMsg([]byte)                  {}
func (d metaDelegate) GetBroadcasts(int, int) [][]byte   { return nil }
func (d metaDelegate) LocalState(bool) []byte            { return nil }
func (d metaDelegate) MergeRemoteState(b []byte, _ bool) {}

// measurePushPull measures memberlist's own push-pull per byte of node
// state: k real memberlist nodes (encryption and label as rendezvous sets
// them, metaBytes of metadata each) joined over the in-memory network,
// then one member pulls the others' state from the seed n times
// (Memberlist.Join is a push-pull); the CPU beyond the same time idle,
// divided by two (encode and decode) times the bytes that crossed.
func measurePushPull(k, n, metaBytes int) (perByte, perPacket time.Duration, perState int64, err error) {
	nw := &rendezvoustest.Network{}
	var tr traffic
	var mls []*memberlist.Memberlist
	defer func() {
		for _, m := range mls {
			_ = m.Shutdown()
		}
	}()
	key := make([]byte, 32)
	addr := func(i int) string { return fmt.Sprintf("10.9.%d.%d:7946", i/250, i%250+1) }
	for i := range k {
		t, err := nw.NewTransport(addr(i))
		if err != nil {
			return 0, 0, 0, err
		}
		c := memberlist.DefaultLANConfig()
		c.Name = fmt.Sprintf("%d@simscale-pushpull", i)
		c.Transport = &countingTransport{NodeAwareTransport: t, t: &tr}
		c.SecretKey, c.Label, c.EnableCompression = key, "simscale-pushpull", false
		c.LogOutput = io.Discard
		c.Delegate = metaDelegate{meta: make([]byte, metaBytes)}
		m, err := memberlist.Create(c)
		if err != nil {
			return 0, 0, 0, err
		}
		mls = append(mls, m)
		if i > 0 {
			if _, err := m.Join([]string{addr(0)}); err != nil {
				return 0, 0, 0, fmt.Errorf("push-pull cluster: join %d: %w", i, err)
			}
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for mls[1].NumMembers() < k || mls[0].NumMembers() < k {
		if time.Now().After(deadline) {
			return 0, 0, 0, fmt.Errorf("push-pull cluster of %d did not converge", k)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // the joins' gossip drains
	const window = 2 * time.Second
	c0 := cpuTime()
	time.Sleep(window)
	idle := cpuTime() - c0
	b0 := tr.streamBytes.Load()
	c0, t0 := cpuTime(), time.Now()
	for range n {
		if _, err := mls[1].Join([]string{addr(0)}); err != nil {
			return 0, 0, 0, err
		}
	}
	took := time.Since(t0)
	cpu := cpuTime() - c0 - time.Duration(float64(idle)*took.Seconds()/window.Seconds())
	bytes := tr.streamBytes.Load() - b0
	if bytes == 0 {
		return 0, 0, 0, fmt.Errorf("push-pulls of %d members carried no bytes", k)
	}
	// Packets in a burst, as a leader sends kindGone to every other one:
	// SendBestEffort (encrypt, write; the receiver decrypts and hands it
	// to the delegate), 200 to each member.
	nodes := mls[0].Members()
	msg := make([]byte, 8)
	c0, t0 = cpuTime(), time.Now()
	sent := 0
	for range 200 {
		for _, nd := range nodes {
			if err := mls[0].SendBestEffort(nd, msg); err == nil {
				sent++
			}
		}
	}
	time.Sleep(100 * time.Millisecond) // the receivers drain
	took = time.Since(t0)
	pcpu := cpuTime() - c0 - time.Duration(float64(idle)*took.Seconds()/window.Seconds())
	if sent == 0 {
		return 0, 0, 0, fmt.Errorf("no packet sent among %d members", k)
	}
	return time.Duration(float64(cpu) / float64(2*bytes)), pcpu / time.Duration(sent), bytes / int64(2*n), nil
}
