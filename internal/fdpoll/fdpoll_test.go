//go:build linux

package fdpoll

import (
	"os"
	"slices"
	"testing"
	"time"
)

// A pipe with bytes (or a closed writer) is ready under its token; an
// empty one is not; Wake ends a wait; a removed descriptor is not
// reported; Close leaves no descriptor behind.
func TestPoller(t *testing.T) {
	ents, _ := os.ReadDir("/proc/self/fd")
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	var rs, ws []*os.File
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		rs, ws = append(rs, r), append(ws, w)
		if err := p.Add(int(r.Fd()), int32(i)); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for i := range rs {
			rs[i].Close()
			ws[i].Close()
		}
	}()
	if ready, woken, err := p.Wait(nil, 10*time.Millisecond); err != nil || len(ready) != 0 || woken {
		t.Fatalf("idle pipes: ready %v, woken %v, %v", ready, woken, err)
	}
	ws[1].Write([]byte("x"))
	ws[2].Close()
	ready, _, err := p.Wait(nil, time.Second)
	slices.Sort(ready)
	if err != nil || !slices.Equal(ready, []int32{1, 2}) {
		t.Fatalf("ready %v, %v; want [1 2]", ready, err)
	}
	if err := p.Remove(int(rs[1].Fd())); err != nil {
		t.Fatal(err)
	}
	if ready, _, _ := p.Wait(nil, time.Second); !slices.Equal(ready, []int32{2}) {
		t.Fatalf("after Remove: ready %v, want [2]", ready)
	}
	p.Remove(int(rs[2].Fd()))
	go func() { time.Sleep(20 * time.Millisecond); p.Wake() }()
	if ready, woken, err := p.Wait(nil, -1); err != nil || !woken || len(ready) != 0 {
		t.Fatalf("after Wake: ready %v, woken %v, %v", ready, woken, err)
	}
	if err := p.Add(3, -1); err == nil {
		t.Error("a negative token was taken")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range rs {
		rs[i].Close()
		ws[i].Close()
	}
	if after, _ := os.ReadDir("/proc/self/fd"); len(after) != len(ents) {
		t.Errorf("%d descriptors before, %d after", len(ents), len(after))
	}
}
