package comm

import (
	"context"
	"fmt"
	"testing"
)

// echoLink is a Link to a peer that always sends back what this rank sent:
// on two ranks, what a peer running the same calls sends (the same
// fingerprint, sequence number and length). It never waits, so a
// benchmark over it measures the token holder's own work on a call, not
// the wire or the peer.
type echoLink struct {
	h       Header
	payload []byte
}

var _ ReduceReceiver = (*echoLink)(nil)

func (l *echoLink) Send(h *Header, payload []byte) error {
	l.h = *h
	l.payload = append(l.payload[:0], payload...)
	return nil
}
func (l *echoLink) RecvHeader(h *Header) error   { *h = l.h; return nil }
func (l *echoLink) RecvPayload(dst []byte) error { copy(dst, l.payload); return nil }
func (l *echoLink) EagerLimit() int              { return 128 << 10 }
func (l *echoLink) Kind() string                 { return "echo" }
func (l *echoLink) Close() error                 { return nil }
func (l *echoLink) RecvReduce(dst []byte, f func(dst, src []byte)) error {
	f(dst, l.payload)
	return nil
}

type echoTransport struct{}

func (echoTransport) Connect(_ context.Context, g Group, _ GroupID) ([]Link, error) {
	return []Link{nil, &echoLink{}}, nil
}

// pairGroup is rank 0 of a group of two on one host.
type pairGroup struct{ failed chan struct{} }

func (pairGroup) Rank() int                 { return 0 }
func (pairGroup) Size() int                 { return 2 }
func (pairGroup) GlobalRank(r int) int      { return r }
func (pairGroup) Host(int) string           { return "echo" }
func (pairGroup) DataAddr(r int) string     { return fmt.Sprintf("echo:%d", r) }
func (g pairGroup) Failed() <-chan struct{} { return g.failed }
func (pairGroup) Err() error                { return nil }

// BenchmarkLonePath is the token holder's work on a lone 8-byte
// all-reduce, issued and waited for at once, with fusion off (execute,
// the unfused path) and on (runFused, which a lone call takes since it
// cannot know whether its peer fuses): what fusion costs a call that has
// no company, apart from the wire (whose frames are the same). The peer
// is an echo, so no waiting and no other process blurs the figure.
//
//	go test -run '^$' -bench LonePath -count 10 ./comm/
func BenchmarkLonePath(b *testing.B) {
	for _, fuse := range []int{0, DefaultConfig().FuseBytes} {
		b.Run(fmt.Sprintf("fuse=%d", fuse), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.FuseBytes = fuse
			cfg.DesyncCheckAfter = 0
			c, err := New(context.Background(), pairGroup{make(chan struct{})}, echoTransport{}, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := Float32s(make([]float32, 2))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := c.AllReduce(ctx, buf, buf, Sum).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
