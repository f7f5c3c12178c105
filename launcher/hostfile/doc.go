// Package hostfile owns the host list: Host, a machine name with its slots,
// and the two spellings users write a list in, an Open MPI style hostfile
// (Parse, ParseReader) and mpirun's -H value (ParseList), both with SLURM
// hostlist expressions (package hostlist). It is pure: it reads a file or a
// string and does no other I/O.
//
// Bad input is refused with a *ParseError naming the file (HostListSource
// for -H), the line and the part that is wrong. Whether a name is this
// machine, and how ranks are placed on the hosts, belong to the launcher
// (local.go, plan.go); reading a SLURM allocation's hosts is
// launcher.SlurmHosts.
//
// Its errors keep the "launcher: hostfile:" prefix users have always seen.
package hostfile
