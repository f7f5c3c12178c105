//go:build !linux

package overlap

// threadUsage cannot read a thread's usage here: the executor never sees
// its compute block, and a rank bound to fewer CPUs than Config.MinProcs
// keeps its Ps.
func threadUsage() (tid int, cpuNs, voluntary int64, ok bool) { return 0, 0, 0, false }
