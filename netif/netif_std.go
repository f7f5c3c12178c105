package netif

import (
	"fmt"
	"net"
	"net/netip"
)

// This file is what netif knows without netlink, from the standard library
// alone: the fallback on systems other than Linux (netif_other.go), and
// compiled everywhere so that its tests run on Linux too.

// routeGetUDP learns the source address the system would use for dst by
// connecting a UDP socket to it (connect on a datagram socket does the
// route lookup and sends nothing), then the interface that holds that
// address. A dst on this machine gives a loopback route, as on Linux.
func routeGetUDP(dst netip.Addr, links []link) (route, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return route{}, fmt.Errorf("netif: route to %s: %w", dst, err)
	}
	defer c.Close()
	src := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	for _, l := range links {
		for _, a := range l.addrs {
			if a.Addr() == src {
				return route{linkIndex: l.index, src: src}, nil
			}
		}
	}
	if src.IsLoopback() {
		// Some systems route to a local address through the loopback
		// interface yet give the local address as the source.
		for _, l := range links {
			if l.loop {
				return route{linkIndex: l.index, src: src}, nil
			}
		}
	}
	return route{}, fmt.Errorf("netif: route to %s: source %s is on no interface (have: %s)", dst, src, describe(links))
}

// readLinksStd lists the interfaces through net.Interfaces. The interface
// kind (bridge, veth...) is unknown here; virtualRank still recognises the
// usual names.
func readLinksStd() ([]link, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("netif: list interfaces: %w", err)
	}
	var out []link
	for _, ifc := range ifs {
		l := link{
			name: ifc.Name, index: ifc.Index,
			up:   ifc.Flags&net.FlagUp != 0,
			loop: ifc.Flags&net.FlagLoopback != 0,
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if p, ok := prefixOf(ipn); ok {
					l.addrs = append(l.addrs, p)
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// prefixOf converts an interface address to a prefix (IPv4-mapped
// addresses unmapped); ok is false for a malformed address.
func prefixOf(ipn *net.IPNet) (netip.Prefix, bool) {
	ip, ok := netip.AddrFromSlice(ipn.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := ipn.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}
