// Package sim owns a discrete-event model of gorun at scale: how a job of
// thousands of hosts forms its world, notices a lost rank or host, starts
// through the agent tree and runs MPICH's PMI fence, on a virtual clock.
//
// It is a model, not the real code under a virtual clock: the protocols of
// rendezvous/ (host-leader formation, memberlist's gossip and probing,
// the World's doubt of a silence), launcher/ (the √N agent tree) and pmi/
// (batched answers) are re-stated here event by event, each step named
// after the function it stands for, and every step is charged the CPU time
// and bytes measured for the real code on this machine (Costs, measured by
// bench/simscale -measure). What makes the costs honest is the CPU queue:
// each simulated host has a fixed number of cores, a handler waits for a
// free core and holds it for its cost, so a thousand members neither starve
// nor get free CPU. Calibration runs put every host on one shared CPU (the
// in-process benchmark's two cores).
//
// What it leaves to others: the protocols themselves (rendezvous, launcher,
// pmi); measuring the costs of the real code (bench/simscale); printing
// tables (bench/simscale). Everything here is deterministic for a seed:
// no goroutines, no wall clock.
package sim
