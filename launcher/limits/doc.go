// Package limits owns the limits of a machine that a job's rank count
// meets: MaxRanks (package launcher/plan), open files, processes and
// threads (ulimit -u, kernel.pid_max, kernel.threads-max) and the pids
// controller of gorun's cgroup. Read reads this machine's; Check, pure,
// refuses a rank count they cannot serve with a *plan.CapacityError.
//
// Counts gorun cannot serve are refused before anything is allocated for
// them. An absurd -np otherwise grows the plan (one environment per rank)
// until the machine runs out of memory, and a merely too large one fails
// late and cryptically ("pipe2: too many open files") after starting part
// of the job. gorun checks the launching machine for a local job, and each
// host agent its own host for a multi-host one; how a refusal reaches the
// user belongs to the launcher.
package limits
