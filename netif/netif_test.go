package netif

import (
	"net/netip"
	"testing"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

var testLinks = []link{
	{name: "lo", index: 1, up: true, loop: true, addrs: []netip.Prefix{pfx("127.0.0.1/8"), pfx("::1/128")}},
	{name: "docker0", index: 2, up: true, kind: "bridge", addrs: []netip.Prefix{pfx("172.17.0.1/16")}},
	{name: "eth0", index: 3, up: true, kind: "device", addrs: []netip.Prefix{pfx("fe80::1/64"), pfx("10.1.2.3/16")}},
	{name: "ib0", index: 4, up: true, kind: "ipoib", addrs: []netip.Prefix{pfx("fd00::5/64")}},
	{name: "down0", index: 5, up: false, kind: "device", addrs: []netip.Prefix{pfx("192.168.9.9/24")}},
}

func TestOverride(t *testing.T) {
	for _, tc := range []struct {
		spec, name, addr string
		bad              bool
	}{
		{spec: "eth0", name: "eth0", addr: "10.1.2.3"},
		{spec: "10.1.0.0/16", name: "eth0", addr: "10.1.2.3"},
		{spec: "10.1.2.3/32", name: "eth0", addr: "10.1.2.3"},
		{spec: "fd00::/8", name: "ib0", addr: "fd00::5"},
		{spec: "ib0", name: "ib0", addr: "fd00::5"},
		{spec: "wlan0", bad: true},
		{spec: "10.9.0.0/16", bad: true},
	} {
		c, err := override(tc.spec, testLinks)
		if tc.bad {
			if err == nil {
				t.Errorf("override(%q) = %v, want an error", tc.spec, c)
			}
			continue
		}
		if err != nil || c.Name != tc.name || c.Addr.String() != tc.addr {
			t.Errorf("override(%q) = %v, %v; want %s %s", tc.spec, c, err, tc.name, tc.addr)
		}
	}
}

func TestPickDefault(t *testing.T) {
	for _, tc := range []struct {
		name     string
		links    []link
		defaults []int
		want     string
	}{
		{"default route wins", testLinks, []int{4}, "ib0"},
		{"no default route: ordinary before docker and lo", testLinks, nil, "eth0"},
		{"default route through docker still loses to a real one", testLinks, []int{2}, "eth0"},
		{"docker when nothing else", testLinks[:2], nil, "docker0"},
		{"loopback as the last resort", testLinks[:1], nil, "lo"},
	} {
		c, err := pickDefault(tc.links, tc.defaults)
		if err != nil || c.Name != tc.want {
			t.Errorf("%s: got %v, %v; want %s", tc.name, c, err, tc.want)
		}
	}
	if _, err := pickDefault([]link{testLinks[4]}, nil); err == nil {
		t.Error("only a down interface: want ErrNoInterface")
	}
}

// TestLive runs the netlink paths on this machine: loopback is never the
// answer toward loopback when another interface has an address.
func TestLive(t *testing.T) {
	links, err := readLinks()
	if err != nil {
		t.Skipf("netlink unavailable: %v", err)
	}
	c, err := Toward(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	nonLoop := false
	for _, l := range links {
		if _, ok := bestAddr(l.addrs); ok && !l.loop && l.up {
			nonLoop = true
		}
	}
	if nonLoop && c.Name == "lo" {
		t.Errorf("Toward(127.0.0.1) = %v; want a non-loopback interface", c)
	}
	t.Logf("toward loopback: %v", c)
}
