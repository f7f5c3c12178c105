// Package rankenv owns the contract between a launcher and the rank processes
// it starts: the names of the environment variables every rank receives, and
// what each one means.
//
// gorun sets the variables of every protocol it serves at once (torch's
// env:// rendezvous, MPICH's PMI, CUDA and its own GORUN_*) so that
// unmodified programs run, and none of a protocol it does not serve. The launcher
// builds these variables; the rendezvous reads them. Neither of those steps
// lives here: this package names the variables and documents their
// meaning, so the two sides cannot drift apart, and says which variables
// of another launcher a rank must not inherit (WithoutOtherLaunchers).
package rankenv
