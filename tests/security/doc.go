// Package security runs the attacks of SECURITY.md's threat model against
// real gorun jobs: a second, unprivileged local user (created by the tests'
// set-up and removed after) and processes on the namespace hosts'
// network try to stop, hijack or read a job, and the job must finish with
// correct results. The tests need root (to create the user and the
// namespace hosts) and skip without it.
//
// The test binary is every party: the rank program (an all-reduce whose
// result each rank checks) and the attacker (run as the second user).
package security
