package netif

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Choice is an interface and one of its addresses.
type Choice struct {
	// Name is the interface name, e.g. eth0.
	Name string
	// Addr is the address on Name that peers should use.
	Addr netip.Addr
	// Why says how the choice was made, for -v output.
	Why string
}

func (c Choice) String() string { return fmt.Sprintf("%s %s (%s)", c.Name, c.Addr, c.Why) }

// ErrNoInterface is returned when no usable interface has an address.
var ErrNoInterface = errors.New("netif: no interface with a usable address")

// route is the kernel's answer to "how is dst reached": the outgoing
// interface and, when the route names one, the source address.
type route struct {
	linkIndex int
	src       netip.Addr // invalid: the route names no source
}

// link is what selection needs to know of an interface; a seam so that the
// ranking rules are tested without netlink.
type link struct {
	name  string
	index int
	up    bool
	loop  bool
	kind  string // netlink link type: device, bridge, veth, ...
	addrs []netip.Prefix
}

// Override picks the interface the user named with --iface: an interface
// name (eth0) or a CIDR (10.1.0.0/16) that one of its addresses is in. IPv4
// addresses win over IPv6 ones on the same interface, as most fabrics and
// MASTER_ADDR consumers expect.
func Override(spec string) (Choice, error) {
	links, err := readLinks()
	if err != nil {
		return Choice{}, err
	}
	return override(spec, links)
}

func override(spec string, links []link) (Choice, error) {
	if p, err := netip.ParsePrefix(spec); err == nil {
		p = p.Masked()
		for _, l := range links {
			for _, a := range l.addrs {
				if p.Contains(a.Addr()) {
					return Choice{Name: l.name, Addr: a.Addr(), Why: "--iface " + spec}, nil
				}
			}
		}
		return Choice{}, fmt.Errorf("netif: --iface %s: no interface has an address in that network (have: %s)", spec, describe(links))
	}
	for _, l := range links {
		if l.name != spec {
			continue
		}
		if a, ok := bestAddr(l.addrs); ok {
			return Choice{Name: l.name, Addr: a, Why: "--iface " + spec}, nil
		}
		return Choice{}, fmt.Errorf("netif: --iface %s: the interface has no usable address", spec)
	}
	return Choice{}, fmt.Errorf("netif: --iface %s: no such interface (have: %s)", spec, describe(links))
}

// Toward picks the interface and source address the kernel uses to reach
// dst. A destination that is this machine routes through loopback, which
// says nothing about the network, so then the interface that holds dst (or,
// for a loopback dst, Default) is the answer.
func Toward(dst netip.Addr) (Choice, error) {
	r, err := routeGet(dst)
	if err != nil {
		return Choice{}, err
	}
	links, err := readLinks()
	if err != nil {
		return Choice{}, err
	}
	for _, l := range links {
		if l.index != r.linkIndex || l.loop {
			continue
		}
		src := r.src
		if !src.IsValid() {
			a, ok := bestAddr(l.addrs)
			if !ok {
				break
			}
			src = a
		}
		return Choice{Name: l.name, Addr: src.Unmap(), Why: "route to " + dst.String()}, nil
	}
	// Loopback: dst is one of ours.
	if c, ok := holding(dst, links); ok {
		c.Why = "holds " + dst.String()
		return c, nil
	}
	return pickDefault(links, defaultRouteLinks())
}

// Holding returns the interface that holds addr, e.g. the local address of
// a connected socket: the kernel chose it by route lookup when connecting.
// A loopback address falls back to Default.
func Holding(addr netip.Addr) (Choice, error) {
	links, err := readLinks()
	if err != nil {
		return Choice{}, err
	}
	if c, ok := holding(addr.Unmap(), links); ok {
		c.Why = "source address of the connection to gorun"
		return c, nil
	}
	return pickDefault(links, defaultRouteLinks())
}

func holding(addr netip.Addr, links []link) (Choice, bool) {
	for _, l := range links {
		if l.loop {
			continue
		}
		for _, a := range l.addrs {
			if a.Addr() == addr {
				return Choice{Name: l.name, Addr: addr}, true
			}
		}
	}
	return Choice{}, false
}

// Default picks an interface without a destination: the one carrying the
// default route, else the first up interface with an address, ranking
// loopback, docker and libvirt bridges and veths last.
func Default() (Choice, error) {
	links, err := readLinks()
	if err != nil {
		return Choice{}, err
	}
	return pickDefault(links, defaultRouteLinks())
}

func pickDefault(links []link, defaultIdx []int) (Choice, error) {
	best, bestRank := -1, 1<<30
	for i, l := range links {
		if _, ok := bestAddr(l.addrs); !ok || !l.up {
			continue
		}
		rank := 10 * virtualRank(l)
		if !slices.Contains(defaultIdx, l.index) {
			rank += 5
		}
		if rank < bestRank {
			best, bestRank = i, rank
		}
	}
	if best < 0 {
		return Choice{}, ErrNoInterface
	}
	l := links[best]
	a, _ := bestAddr(l.addrs)
	why := "default route"
	if !slices.Contains(defaultIdx, l.index) {
		why = "first usable interface"
	}
	return Choice{Name: l.name, Addr: a, Why: why}, nil
}

// virtualRank is 0 for an ordinary interface, 1 for virtual plumbing of
// containers and VMs (docker0, br-*, virbr*, veth*, cni*, flannel*), 2 for
// loopback: these are used only when nothing else has an address.
func virtualRank(l link) int {
	switch {
	case l.loop:
		return 2
	case l.kind == "veth",
		strings.HasPrefix(l.name, "docker"), strings.HasPrefix(l.name, "br-"),
		strings.HasPrefix(l.name, "virbr"), strings.HasPrefix(l.name, "veth"),
		strings.HasPrefix(l.name, "cni"), strings.HasPrefix(l.name, "flannel"):
		return 1
	}
	return 0
}

// bestAddr prefers a global IPv4 address, then a global IPv6 one;
// link-local addresses are never chosen.
func bestAddr(addrs []netip.Prefix) (netip.Addr, bool) {
	var v6 netip.Addr
	for _, p := range addrs {
		a := p.Addr()
		if a.IsLinkLocalUnicast() || a.IsMulticast() {
			continue
		}
		if a.Is4() {
			return a, true
		}
		if !v6.IsValid() {
			v6 = a
		}
	}
	return v6, v6.IsValid()
}

func describe(links []link) string {
	var parts []string
	for _, l := range links {
		var as []string
		for _, a := range l.addrs {
			as = append(as, a.String())
		}
		parts = append(parts, l.name+" "+strings.Join(as, ","))
	}
	return strings.Join(parts, "; ")
}
