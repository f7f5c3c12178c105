// Package netif owns one decision: which network interface and address a
// host uses to reach the other hosts of a job. The answer comes from the
// kernel's routing table (netlink route lookups and the address a connected
// socket was given), not from guessing by interface names; names only rank
// the candidates when there is no destination to route towards, where
// loopback, container and virtual-machine bridges (docker, libvirt) come
// last.
//
// Off Linux there is no netlink: interfaces come from the standard library
// (their kind is unknown, so only names mark virtual ones), the route to a
// destination from the source address of a connected UDP socket, and
// Default cannot prefer the interface of the default route.
//
// The launcher uses the choice for its own listener and for each host's
// agent, and exports it to ranks (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
// MASTER_ADDR); what the ranks do with it belongs to rendezvous and comm.
package netif
