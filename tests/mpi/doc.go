// Package mpi holds the end-to-end tests of MPI programs under gorun: a C
// program (testdata/mpiprog.c) built with Debian's MPICH runs under a real
// gorun binary, which serves it PMI-1 (package pmi) so that the ranks form
// one world; the checks cover collectives, point-to-point, MPI_Abort, ranks
// killed inside MPI_Init and inside a collective, and the refusal of Open
// MPI programs. The same program across namespace hosts is in
// tests/multihost.
package mpi
