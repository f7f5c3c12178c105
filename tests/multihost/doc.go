// Package multihost holds gorun's end-to-end tests across hosts: the real
// gorun binary launches jobs on network-namespace hosts with their own sshd
// (tests/testhosts), and inside a real single-node SLURM. The test binary
// itself is the rank program (launchertest helper modes, selected per rank
// through -x). Every test ends with the orphan check: nothing of the job
// left on any host.
//
// The tests skip, saying why, when the machine cannot provide the hosts
// (not root, tools missing) and in -short mode.
package multihost
