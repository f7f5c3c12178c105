package supervisor

import (
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/fdpoll"
	"github.com/gorun-hpc/gorun/pmi"
)

// pmiWaiter holds the supervisor's ends of the fd-mode PMI sockets of the
// ranks that have not spoken yet, in one epoll set watched by one
// goroutine, and hands a socket to a connection server of its own (a
// goroutine, pmi.Server.ServeConn) once its rank sends its first byte or
// hangs up. A rank that never uses MPI (most programs gorun starts) so
// costs a descriptor, not a goroutine with its stack and read buffer; at
// thousands of ranks those were most of the supervisor's memory.
type pmiWaiter struct {
	fp  *fdpoll.Poller
	srv *pmi.Server
	log zerolog.Logger
	// fds are the sockets by token, the token being the rank's index;
	// -1 once handed on or closed. Only the waiting goroutine touches
	// them after start.
	fds    []int
	ranks  []int
	served map[int]chan struct{} // closed when the rank's serving ends
	// wg is the supervisorPMI's: the waiting goroutine and the
	// connection servers it starts.
	wg   *sync.WaitGroup
	stop atomic.Bool
	// mu orders a wake-up before the epoll set's close.
	mu     sync.Mutex
	closed bool // guarded by mu
}

// newPMIWaiter takes the sockets fds of ranks (one each, by index) and
// starts watching them; on failure the caller still owns fds.
func newPMIWaiter(srv *pmi.Server, fds, ranks []int, served map[int]chan struct{}, wg *sync.WaitGroup, log zerolog.Logger) (*pmiWaiter, error) {
	fp, err := fdpoll.New()
	if err != nil {
		return nil, err
	}
	for i, fd := range fds {
		if err := fp.Add(fd, int32(i)); err != nil {
			fp.Close()
			return nil, err
		}
	}
	w := &pmiWaiter{fp: fp, srv: srv, log: log, fds: fds, ranks: ranks, served: served, wg: wg}
	wg.Go(w.run)
	return w, nil
}

// run hands on each socket when it becomes readable, until every socket
// was handed on or close asked it to stop; then it closes what is left.
func (w *pmiWaiter) run() {
	defer w.closeSet()
	left := len(w.fds)
	var ready []int32
	for left > 0 {
		var err error
		ready, _, err = w.fp.Wait(ready[:0], -1)
		if err != nil || w.stop.Load() {
			if err != nil {
				w.log.Warn().Err(err).Msg("PMI sockets: waiting failed; the ranks that have not spoken are cut off")
			}
			return
		}
		for _, i := range ready {
			if w.fds[i] >= 0 {
				w.handOn(int(i))
				left--
			}
		}
	}
}

// handOn starts serving the socket of the rank at index i.
func (w *pmiWaiter) handOn(i int) {
	fd, r := w.fds[i], w.ranks[i]
	w.fds[i] = -1
	_ = w.fp.Remove(fd) // before the close: FileConn's duplicate keeps it registered
	f := os.NewFile(uintptr(fd), "pmi-server-"+strconv.Itoa(r))
	c, err := net.FileConn(f) // a duplicate; ours is closed next
	f.Close()
	served := w.served[r]
	if err != nil {
		w.log.Warn().Err(err).Int("rank", r).Msg("PMI socket")
		close(served)
		return
	}
	w.wg.Go(func() {
		defer close(served)
		if err := w.srv.ServeConn(r, c); err != nil && !errors.Is(err, net.ErrClosed) {
			w.log.Warn().Err(err).Int("rank", r).Msg("PMI connection ended with an error")
		}
	})
}

// close makes run close the sockets still waiting and return; the caller
// waits for it on the wait group.
func (w *pmiWaiter) close() {
	w.stop.Store(true)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		_ = w.fp.Wake()
	}
}

// closeSet closes the sockets that never spoke and the epoll set.
func (w *pmiWaiter) closeSet() {
	for i, fd := range w.fds {
		if fd >= 0 {
			_ = syscall.Close(fd)
			w.fds[i] = -1
			close(w.served[w.ranks[i]])
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.fp.Close()
}
