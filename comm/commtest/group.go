package commtest

import "github.com/gorun-hpc/gorun/comm"

// StaticGroup is comm.StaticGroup, kept under this name for the tests that
// build groups next to the in-memory network. Programs use comm.StaticGroup
// (this package imports testing).
type StaticGroup = comm.StaticGroup

// NewStaticGroup is comm.NewStaticGroup.
func NewStaticGroup(me int, addrs, hosts []string) *StaticGroup {
	return comm.NewStaticGroup(me, addrs, hosts)
}
