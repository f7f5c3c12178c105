//go:build !linux

package netif

import "net/netip"

// Without netlink: interfaces from the standard library, routes by
// connecting a UDP socket (see netif_std.go).

func routeGet(dst netip.Addr) (route, error) {
	links, err := readLinks()
	if err != nil {
		return route{}, err
	}
	return routeGetUDP(dst, links)
}

func readLinks() ([]link, error) { return readLinksStd() }

// defaultRouteLinks: the routing table is not read here, so Default ranks
// interfaces by name and kind only ("first usable interface").
func defaultRouteLinks() []int { return nil }
