package hostagent

import (
	"os"
	"sync"
)

// stdinQueue feeds rank 0's stdin pipe from the connection without ever
// blocking the connection's reader (which also keeps the lease): chunks
// queue in memory while rank 0 does not read.
type stdinQueue struct {
	w *os.File

	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte // guarded by mu
	eof    bool     // guarded by mu: no more chunks will come
}

func newStdinQueue(w *os.File) *stdinQueue {
	q := &stdinQueue{w: w}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues a chunk; an empty chunk is EOF. It never blocks for long.
func (q *stdinQueue) push(p []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(p) == 0 {
		q.eof = true
	} else {
		q.chunks = append(q.chunks, append([]byte(nil), p...))
	}
	q.cond.Signal()
}

// close ends the queue as at EOF; run then returns once the pipe is done.
func (q *stdinQueue) close() {
	q.mu.Lock()
	q.eof, q.chunks = true, nil
	q.cond.Signal()
	q.mu.Unlock()
	// A rank that stopped reading would keep a write blocked.
	q.w.Close()
}

// run writes queued chunks to the pipe until EOF, then closes it so rank 0
// sees EOF.
func (q *stdinQueue) run() {
	defer q.w.Close()
	for {
		q.mu.Lock()
		for len(q.chunks) == 0 && !q.eof {
			q.cond.Wait()
		}
		if len(q.chunks) == 0 {
			q.mu.Unlock()
			return
		}
		c := q.chunks[0]
		q.chunks = q.chunks[1:]
		q.mu.Unlock()
		if _, err := q.w.Write(c); err != nil {
			return
		}
	}
}
