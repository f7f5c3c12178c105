//go:build !linux

package comm

// spreadOnce and rehome place crowded ranks on Linux only (see
// spread_linux.go).
func spreadOnce(idx, local int) {}

func rehome(cpu uint32) {}
