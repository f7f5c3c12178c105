// Package testhosts gives end-to-end tests real "remote" hosts and a real
// SLURM on a single machine: network namespaces on a bridge, each running
// its own sshd (Netns), and a single-node slurmctld + slurmd with munge
// (Slurm). The shell scripts next to this file do the work and can be run by
// hand (see README.md); this package runs them, parses what they print and
// tears everything down when the test ends.
//
// Requiring hosts skips the test, with the reason, when the machine cannot
// provide them (not root, tools missing and not installable, -short);
// anything else that goes wrong fails the test. Each caller gets its own
// namespace set with its own subnet, so test binaries of several packages
// may run at once; the SLURM cluster is shared and reference-counted by
// owner process.
//
// What the hosts are used for (launching agents, checking for orphans,
// cutting links) belongs to the tests that use them.
package testhosts
