//go:build cgo

package main

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gorun-hpc/gorun/comm"
)

// Status codes of gorun.h's gorun_status.
const (
	statusOK       = 0
	statusInvalid  = 1
	statusPeerLost = 2
	statusDesync   = 3
	statusTimeout  = 4
	statusAborted  = 5
	statusClosed   = 6
	statusInit     = 7
	statusInternal = 8
)

// errInvalid and errNotInit are this library's own failures, before a call
// reaches comm.
var (
	errInvalid = errors.New("gorun: invalid argument")
	errNotInit = errors.New("gorun: not initialized (call gorun_init first)")
)

// commEntry is a communicator a C handle names.
type commEntry struct {
	id    int64
	c     *comm.Comm
	world bool // the world communicator: closed only by finalize
	// borrowed: a communicator another part of the library owns (a
	// fault-tolerant replica's quorum communicator, gorun_ft_comm), usable
	// without gorun_init; close does not close it.
	borrowed bool
	// close releases the communicator (and, for the world, the rank's
	// start-up); run once, by free or finalize.
	close func() error
}

// reqEntry is an issued call a C handle names.
type reqEntry struct {
	h    comm.Handle
	c    *commEntry
	what string // e.g. "allreduce", for error text
}

// registry maps handles to live objects. Handles are small positive integers
// that are never reused within a process, so a stale handle is an error, not
// another object.
type registry struct {
	mu     sync.Mutex
	next   int64
	sess   *session // nil before init and after finalize
	worldH int64
	comms  map[int64]*commEntry
	reqs   map[int64]*reqEntry
}

var reg = registry{comms: map[int64]*commEntry{}, reqs: map[int64]*reqEntry{}}

func (r *registry) addCommLocked(e *commEntry) int64 {
	r.next++
	e.id = r.next
	r.comms[e.id] = e
	return e.id
}

func (r *registry) comm(h int64) (*commEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.comms[h]
	if r.sess == nil && !(ok && e.borrowed) {
		return nil, errNotInit
	}
	if !ok {
		return nil, fmt.Errorf("%w: no communicator %d (freed, or never made)", errInvalid, h)
	}
	return e, nil
}

func (r *registry) addReq(e *reqEntry) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.reqs[r.next] = e
	return r.next
}

func (r *registry) req(h int64) (*reqEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.reqs[h]
	if !ok {
		return nil, fmt.Errorf("%w: no request %d (freed, or never made)", errInvalid, h)
	}
	return e, nil
}

func (r *registry) dropReq(h int64) (*reqEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.reqs[h]
	if !ok {
		return nil, fmt.Errorf("%w: no request %d (freed, or never made)", errInvalid, h)
	}
	delete(r.reqs, h)
	return e, nil
}
