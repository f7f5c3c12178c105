package netif

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// routeGet asks the kernel's routing table (RTM_GETROUTE) how dst is
// reached.
func routeGet(dst netip.Addr) (route, error) {
	routes, err := netlink.RouteGet(net.IP(dst.AsSlice()))
	if err != nil {
		return route{}, fmt.Errorf("netif: route to %s: %w", dst, err)
	}
	if len(routes) == 0 {
		return route{}, fmt.Errorf("netif: no route to %s", dst)
	}
	r := route{linkIndex: routes[0].LinkIndex}
	if src, ok := netip.AddrFromSlice(routes[0].Src); ok {
		r.src = src
	}
	return r, nil
}

func readLinks() ([]link, error) {
	ls, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netif: list interfaces: %w", err)
	}
	var out []link
	for _, nl := range ls {
		at := nl.Attrs()
		l := link{
			name: at.Name, index: at.Index, kind: nl.Type(),
			up:   at.Flags&net.FlagUp != 0,
			loop: at.Flags&net.FlagLoopback != 0,
		}
		addrs, err := netlink.AddrList(nl, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.IPNet == nil {
				continue
			}
			if p, ok := prefixOf(a.IPNet); ok {
				l.addrs = append(l.addrs, p)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// defaultRouteLinks lists the interfaces that carry a default route.
func defaultRouteLinks() []int {
	var out []int
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteList(nil, fam)
		if err != nil {
			continue
		}
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.LinkIndex > 0 {
				out = append(out, r.LinkIndex)
			}
		}
	}
	return out
}
