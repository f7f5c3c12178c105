// Package netif owns one decision: which network interface and address a
// host uses to reach the other hosts of a job. The answer comes from the
// kernel's routing table (netlink route lookups and the address a connected
// socket was given), not from guessing by interface names; names only rank
// the candidates when there is no destination to route towards, where
// loopback, container and virtual-machine bridges (docker, libvirt) come
// last.
//
// The launcher uses the choice for its own listener and for each host's
// agent, and exports it to ranks (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
// MASTER_ADDR); what the ranks do with it belongs to rendezvous and comm.
package netif
