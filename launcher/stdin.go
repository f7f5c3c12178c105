package launcher

import (
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Forwarding gorun's stdin to rank 0, shared by local jobs (into a pipe the
// supervisor hands to rank 0) and multi-host jobs (into stdin frames to
// rank 0's host agent). The hard part is ending the copy: a read of a
// terminal or an idle pipe blocks forever, and RunLocal and the multi-host
// run must return when the job ends whether or not the user ever types.

// cancellableStdin returns a reader of f whose blocked Read a past read
// deadline ends: a separate open file description of the same file,
// through /proc, in non-blocking mode so the runtime poller serves it —
// without touching the O_NONBLOCK flag of the description the shell
// shares. The caller closes the returned file. A file the poller cannot
// wait on (neither a regular file nor pollable) is an error: a copy from
// it could not be stopped.
func cancellableStdin(f *os.File) (*os.File, error) {
	nf, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if err := nf.SetReadDeadline(time.Time{}); err != nil {
		if st, serr := nf.Stat(); serr != nil || !st.Mode().IsRegular() {
			// A regular file never blocks a read; anything else must be
			// pollable.
			nf.Close()
			return nil, errors.New("stdin is not pollable")
		}
	}
	return nf, nil
}

// stdinPump copies a reader to rank 0 in 64 KiB pieces on one goroutine.
type stdinPump struct {
	src     io.Reader
	stopped atomic.Bool
	wg      sync.WaitGroup
}

// startStdinPump starts copying src through write until EOF, a read error
// or a failed write; end runs last, told whether src reached EOF (the
// caller passes EOF on then: closes rank 0's pipe, or sends an empty
// frame).
func startStdinPump(src io.Reader, write func([]byte) error, end func(eof bool)) *stdinPump {
	p := &stdinPump{src: src}
	p.wg.Go(func() {
		buf := make([]byte, 64<<10)
		for !p.stopped.Load() {
			n, err := src.Read(buf)
			if n > 0 && write(buf[:n]) != nil {
				end(false)
				return
			}
			if err != nil {
				end(errors.Is(err, io.EOF))
				return
			}
		}
		end(false)
	})
	return p
}

// stop ends the copy and returns once the goroutine exited. unblock, when
// set, is called to end a write blocked on a reader that stopped reading
// (closing rank 0's pipe).
func (p *stdinPump) stop(unblock func()) {
	p.stopped.Store(true)
	if d, ok := p.src.(interface{ SetReadDeadline(time.Time) error }); ok {
		_ = d.SetReadDeadline(time.Unix(1, 0))
	}
	if unblock != nil {
		unblock()
	}
	p.wg.Wait()
}
