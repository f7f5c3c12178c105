package rendezvous

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// addrs is where the gossip listener binds and what it advertises.
type addrs struct {
	bindIP      string
	advertiseIP string
	port        int // 0: a free port, read back after binding
}

// addresses decides the gossip addresses for the real network.
//
// Rank 0 binds the seed's port: that is what the seed address means. The
// others bind a free port (no fixed-port collisions between jobs) on the
// address that routes to the seed, which is also what they advertise: the
// kernel's choice of source address for the seed is the interface the
// seed's network reaches, so a job on loopback stays on loopback and a job
// across hosts never advertises a docker bridge or 127.0.0.1.
func (c *Config) addresses() (addrs, error) {
	if c.Seed == "" { // world of one
		ip := c.AdvertiseAddr
		if ip == "" {
			ip = "127.0.0.1"
		}
		return addrs{bindIP: firstNonEmpty(c.BindAddr, ip), advertiseIP: ip}, nil
	}
	host, portStr, err := net.SplitHostPort(c.Seed)
	if err != nil {
		return addrs{}, &ConfigError{Field: "Seed", Problem: err.Error()}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return addrs{}, &ConfigError{Field: "Seed", Problem: fmt.Sprintf("bad port %q", portStr)}
	}
	seedIP, err := resolve(host)
	if err != nil {
		return addrs{}, fmt.Errorf("rendezvous: rank %d: resolve seed host %q: %w", c.Rank, host, err)
	}
	if c.Rank == 0 {
		adv := firstNonEmpty(c.AdvertiseAddr, seedIP.String())
		bind := c.BindAddr
		if bind == "" {
			// The seed's IP is normally one of ours (the launcher chose
			// it); when it is not (NAT, a name that resolves elsewhere),
			// listen everywhere and still advertise the seed's address.
			bind = "0.0.0.0"
			if isLocalIP(seedIP) {
				bind = seedIP.String()
			}
		}
		return addrs{bindIP: bind, advertiseIP: adv, port: port}, nil
	}
	adv := c.AdvertiseAddr
	if adv == "" {
		ip, err := routeTo(seedIP, port)
		if err != nil {
			return addrs{}, fmt.Errorf("rendezvous: rank %d: no route to the seed %s: %w", c.Rank, c.Seed, err)
		}
		adv = ip.String()
	}
	return addrs{bindIP: firstNonEmpty(c.BindAddr, adv), advertiseIP: adv}, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// resolve returns host's address, IPv4 first (memberlist's packets carry
// either, but mixed families between members would not reach each other).
func resolve(host string) (net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip, nil
		}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("no addresses for %q", host)
	}
	return ips[0], nil
}

// routeTo returns the local address the kernel uses to reach ip: "connecting"
// a UDP socket picks a route and a source address without sending anything.
func routeTo(ip net.IP, port int) (net.IP, error) {
	conn, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).IP, nil
}

// isLocalIP reports whether ip is assigned to this host (loopback included).
func isLocalIP(ip net.IP) bool {
	if ip.IsLoopback() {
		return true
	}
	as, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}
