// Package output owns where a job's output goes: the ranks' stdout and
// stderr made line-whole on gorun's own stdout and stderr (a line of one
// rank never interleaves with another's, and one longer than 1 MiB is
// written in pieces kept together unless its rank pauses mid-line; [rank]
// tags and timestamps on request), and with --output-dir one log per rank, opened so that no
// other user can redirect or replace it (dir.go).
//
// A Job takes readers, one per rank stream, whatever brings the bytes: the
// ranks' pipes in a local job, a host agent's frames in a multi-host one.
// Pipes (non-blocking *os.File) are read by one goroutine over an epoll
// set (poller.go), so a rank costs the launcher a small struct per stream
// and no goroutine or idle buffer; other readers get a goroutine each.
// Starting ranks, pipes and the wire are the launcher's; so is gorun's
// stdin, forwarded to rank 0 (launcher/stdin.go).
//
// A log that cannot be written does not stop the job: its first error is
// said at once on stderr, and Finish returns a *LostError (exit code 74)
// that names it. An output directory gorun refuses is a *DirError naming
// the path and why. Its errors keep the "launcher: output" prefixes users
// have always seen.
package output
