//go:build !linux

package comm_test

// The multi-process tests use Linux process attributes (Pdeathsig).
func childMain() int { return 1 }

const desyncChildEnv = "GORUN_DESYNC_CHILD"

func desyncChildMain() int { return 1 }
