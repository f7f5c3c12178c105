// Package chaos is the chaos matrix: fault kinds (kill, stop,
// slow, drop, delay, corrupt, partition) x phases (launch, rendezvous
// formation, mid-collective small and large, barrier, bucket flush,
// shutdown) x launch modes (gorun on one host; a direct torch-style launch
// with no gorun supervising, ranks started by the test with RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT), each row run against the real
// gorun binary and real rank processes (this test binary, re-executed).
//
// After every row the same invariants are checked: bounded time (no
// hang), no process of the row left, an exit code and one-line message
// naming the culprit (rank and cause), every survivor's error naming the
// lost or frozen rank, no shared-memory segment or temp file left, and,
// with restarts on, the job completing with the right result.
//
// `go test ./tests/chaos` (part of make test) runs a covering subset;
// GORUN_CHAOS=full (make test-chaos) runs every row and prints the matrix
// as a table with timings.
package chaos
