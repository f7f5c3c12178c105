package rank

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/gorun-hpc/gorun/netif"
)

// The data-plane address policy, in order:
//
//  1. GORUN_DATA_ADDR (rendezvous.Config.DataAddr) or Options.ListenAddr:
//     the user said where; listen there.
//  2. Options.Iface (an interface name or CIDR): the address netif.Override
//     picks on it.
//  3. No seed (a world of one): loopback; nobody else connects.
//  4. A loopback seed: loopback. The launcher chose a loopback rendezvous,
//     so every rank is on this machine, and the rendezvous advertises
//     loopback too.
//  5. Otherwise the address netif.Toward picks for the seed: the source
//     address of the kernel's route to rank 0's host, the same address the
//     rendezvous advertises for gossip, so the data plane and gossip never
//     land on different networks (a docker bridge, say) by accident.
//
// The port is always chosen by the kernel (":0") unless the user's address
// names one.

// listenAddr returns the host:port the endpoint listens on and a phrase
// saying why, for the debug log.
func listenAddr(ctx context.Context, userAddr, iface, seed string) (addr, why string, err error) {
	switch {
	case userAddr != "":
		return userAddr, "given", nil
	case iface != "":
		c, err := netif.Override(iface)
		if err != nil {
			return "", "", fmt.Errorf("%w: Iface: %w", ErrConfig, err)
		}
		return net.JoinHostPort(c.Addr.String(), "0"), c.String(), nil
	case seed == "":
		return "127.0.0.1:0", "alone", nil
	}
	host, _, err := net.SplitHostPort(seed)
	if err != nil {
		return "", "", fmt.Errorf("%w: rendezvous seed %q: %w", ErrConfig, seed, err)
	}
	ip, err := resolve(ctx, host)
	if err != nil {
		return "", "", fmt.Errorf("%w: rendezvous seed host %q: %w", ErrConfig, host, err)
	}
	if ip.IsLoopback() {
		return net.JoinHostPort(ip.String(), "0"), "loopback seed " + seed, nil
	}
	c, err := netif.Toward(ip)
	if err != nil {
		return "", "", fmt.Errorf("rank: no interface reaches the rendezvous seed %s: %w", seed, err)
	}
	return net.JoinHostPort(c.Addr.String(), "0"), c.String(), nil
}

// resolve returns host's address, IPv4 first, as the rendezvous does (its
// gossip and the data plane must agree on the family).
func resolve(ctx context.Context, host string) (netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return ip.Unmap(), nil
		}
	}
	if len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("no addresses for %q", host)
	}
	return ips[0], nil
}
