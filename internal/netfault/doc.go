// Package netfault describes the data-plane faults gorun injects inside its
// own transport (gorun --inject drop|delay|corrupt|partition:...): their
// spellings, the check against a world size, and the environment contract
// (GORUN_NETFAULT, GORUN_NETFAULT_EPOCH) by which gorun, or a harness that
// starts ranks itself, arms them in every rank.
//
// It owns only the description. Acting on it is comm's (comm/netfault.go
// wraps each link of a communicator when, and only when, a fault is armed,
// so an unarmed job's frames take exactly the path they take without this
// package). Scheduling and reporting are the launcher's (launcher/inject_chaos.go).
//
// The package is pure apart from FromEnv, which reads the environment and
// the clock once.
package netfault
