//go:build cgo

// Command libgorun is the C ABI of gorun's runtime, built as a shared
// library: go build -buildmode=c-shared -o libgorun.so ./libgorun (or make
// lib). gorun.h, next to this file, is its contract and documentation; the
// Python package in python/ loads it with ctypes.
//
// What it owns: the mapping between C calls and the runtime — integer handles
// for communicators and requests (no Go pointer ever crosses the boundary,
// so cgo's pointer rules hold by construction), raw host pointers viewed as
// comm buffers without copying, status codes, and the calling thread's error
// text. Joining the world belongs to the rank start-up shared with gorun's
// Go programs, collectives to comm.
//
// # The planner
//
// gorun_plan (planner.go) is `gorun plan` as a call: a step graph and
// options as JSON in, the plan, the planned graph and their hashes as JSON
// out, in a buffer the caller frees with gorun_plan_free. It needs no
// gorun_init and talks to no other rank: planning is a pure function of its
// input, so ranks that plan alike get the same hash.
//
// # Threads and signals
//
// Exported functions run on the caller's OS thread; collectives progress on
// goroutines of the communicator, so an asynchronous call moves while the
// caller computes. A call the caller waits for (a NULL request) runs on the
// caller's thread (with any earlier calls still queued), large steps
// included: comm sends and receives their frames in turns there rather than
// handing the sends to its sender goroutines (comm.SetForeignCallers), since
// every hand-off between a C thread and Go's threads costs thread switches.
// The exception is a call on more than two ranks over shared memory whose
// ring steps are at least half the ring (an all-reduce of 8 MiB on 4 ranks):
// it goes to the communicator's worker goroutine while the caller's thread
// sleeps in the wait (comm's handsOff).
// GOMAXPROCS defaults to 2 here (unless the GOMAXPROCS environment variable
// is set) because the host program — Python with torch's own thread pools —
// owns the cores; the runtime adds a handful of OS threads. Go installs
// handlers only for the synchronous signals it needs (SIGSEGV, SIGBUS,
// SIGFPE, SIGPIPE, SIGURG) and leaves SIGINT and SIGTERM to the host
// program. Every exported function recovers a panic into
// GORUN_ERR_INTERNAL; nothing here calls os.Exit.
//
// # Fork
//
// Go's runtime does not survive fork: a child process must not call into the
// library (the Python package refuses it with a clear error). Children that
// never call it, such as torch DataLoader workers, are fine.
package main

func main() {} // required by -buildmode=c-shared; never runs
