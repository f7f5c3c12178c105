// Package fdpoll owns waiting, in one goroutine, for any of many file
// descriptors to become readable: an epoll set with a wake-up descriptor.
//
// It exists for the launcher's per-rank descriptors (every rank's stdout
// and stderr pipe, every rank's PMI socket until its rank first speaks):
// one goroutine blocked in Read per descriptor costs a stack and a buffer
// per rank, and at thousands of ranks those dominate the launcher's
// memory. A Poller costs a few bytes per descriptor in the kernel and
// nothing per descriptor in Go.
//
// What it leaves to its users: reading the descriptors (a ready token only
// says that a read will not block, or that the peer hung up), owning and
// closing them, and the goroutine that calls Wait. Descriptors are watched
// level-triggered: a descriptor stays ready until it is drained, so a user
// that does not read a ready descriptor must Remove it, or Wait returns at
// once forever.
//
// Linux only (epoll); Supported reports false elsewhere and New fails, and
// users fall back to a goroutine per descriptor.
package fdpoll
