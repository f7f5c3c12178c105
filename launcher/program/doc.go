// Package program owns the checks a rank program passes before any rank
// starts, on the launching machine for a local job and on each host (in its
// host agent) for a multi-host one: that the name resolves to an
// executable the way a shell would find it (Resolve), and that it is not
// linked against Open MPI, whose ranks gorun would start as one-rank
// singletons (CheckOpenMPI, ErrOpenMPI). A program that fails either is
// an *Error, exit code 127 like a shell's.
//
// Sending a program to hosts that lack it (preloads) and starting it belong
// to the launcher. Its errors keep the "launcher:" prefix users have always
// seen.
package program
