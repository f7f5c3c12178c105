//go:build !linux

package comm

// spreadOnce places crowded ranks on Linux only (see spread_linux.go).
func spreadOnce(idx, local int) {}
