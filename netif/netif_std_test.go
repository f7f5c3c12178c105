package netif

import (
	"net/netip"
	"strings"
	"testing"
)

// The standard-library reader sees the loopback interface and its address,
// and the UDP route lookup sends 127.0.0.1 through it.
func TestStdLoopback(t *testing.T) {
	links, err := readLinksStd()
	if err != nil {
		t.Fatal(err)
	}
	lo := -1
	for _, l := range links {
		for _, a := range l.addrs {
			if a.Addr() == netip.MustParseAddr("127.0.0.1") {
				if !l.loop || !l.up {
					t.Errorf("%s holds 127.0.0.1 but loop=%v up=%v", l.name, l.loop, l.up)
				}
				lo = l.index
			}
		}
	}
	if lo < 0 {
		t.Fatalf("no interface holds 127.0.0.1: %s", describe(links))
	}
	r, err := routeGetUDP(netip.MustParseAddr("127.0.0.1"), links)
	if err != nil {
		t.Fatal(err)
	}
	if r.linkIndex != lo || r.src != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("route to 127.0.0.1 = %+v, want interface %d source 127.0.0.1", r, lo)
	}
}

// A source address that no listed interface holds is an error naming what
// there is, not a guess.
func TestStdRouteUnknownSource(t *testing.T) {
	links := []link{{name: "eth0", index: 3, up: true, addrs: []netip.Prefix{pfx("10.1.2.3/16")}}}
	_, err := routeGetUDP(netip.MustParseAddr("127.0.0.1"), links)
	if err == nil || !strings.Contains(err.Error(), "eth0 10.1.2.3/16") {
		t.Fatalf("err = %v, want one listing eth0 10.1.2.3/16", err)
	}
}

// Both readers agree on the interfaces' names, indices, flags and
// addresses where both exist (Linux), so that the fallback makes the same
// choices as netlink would.
func TestStdMatchesPlatform(t *testing.T) {
	std, err := readLinksStd()
	if err != nil {
		t.Fatal(err)
	}
	plat, err := readLinks()
	if err != nil {
		t.Skipf("platform reader: %v", err)
	}
	byIndex := map[int]link{}
	for _, l := range plat {
		byIndex[l.index] = l
	}
	for _, s := range std {
		p, ok := byIndex[s.index]
		if !ok {
			t.Errorf("%s (index %d) missing from the platform reader", s.name, s.index)
			continue
		}
		if s.name != p.name || s.up != p.up || s.loop != p.loop {
			t.Errorf("index %d: std %s up=%v loop=%v, platform %s up=%v loop=%v", s.index, s.name, s.up, s.loop, p.name, p.up, p.loop)
		}
		for _, a := range s.addrs {
			found := false
			for _, b := range p.addrs {
				found = found || a == b
			}
			if !found {
				t.Errorf("%s: std address %s not in platform's %v", s.name, a, p.addrs)
			}
		}
	}
}
