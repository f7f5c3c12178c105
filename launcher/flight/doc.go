// Package flight owns one host's flight directory: the directory a host's
// ranks write their flight records into (comm.FlightDirEnv names it for
// them), made and removed by the process that runs them — gorun for a
// local job, each host agent for its own ranks in a multi-host one.
//
// Every rank's communicators write their recent calls there when they fail
// and on SIGUSR2; a rank that installed that handler says so with a
// ready.<pid> marker, and writes dumped.<pid> after each dump it makes on
// the signal (comm/flight_unix.go). A Dir asks those ranks to dump
// (SignalReady), counts who did (DumpedSince), and does both with a bound
// before a failed job's teardown (DumpBeforeStop).
//
// A temporary directory (MakeTemp) is named after the process that made
// it, gorun-flight-<pidns>-<pid>-<random>, as shared-memory segments are
// (package internal/owner). Its maker removes it at the end (Remove), and
// a host agent's supervisor removes the agent's if the agent dies; what
// neither can remove is the directory of a process killed with everything
// around it (a host taken down whole: a kill-host injection does that to a
// host's agent, supervisor and ranks at once). So each new one first
// removes those of dead processes: in this PID namespace (a pid means
// nothing in another), owned by this user, whose process no longer exists.
//
// Merging the records into one table, and gathering them from the hosts,
// are gorun's (package launcher, flight.go); sending a host's records to
// gorun is its host agent's (launcher/hostagent). This package reads no
// connection and prints nothing.
package flight
