//go:build cgo

package main

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/handles"
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

// registry is gorun_init's state: the session and the communicators and
// requests C handles name. Handles are never reused within a process
// (package handles), so a stale handle is an error, not another object.
type registry struct {
	// mu guards sess and worldH, and orders a finalize against handing
	// out a communicator of the session it ends. Order: mu before the
	// tables' own locks.
	mu     sync.Mutex
	sess   *session // nil before init and after finalize
	worldH int64

	comms *handles.Table[*commEntry]
	reqs  *handles.Table[*reqEntry]
}

var reg = registry{
	comms: handles.New[*commEntry]("communicator", "freed, or never made"),
	reqs:  handles.New[*reqEntry]("request", "freed, or never made"),
}

// invalidHandle is a handle that names nothing, as the caller's error.
func invalidHandle(err error) error {
	return fmt.Errorf("%w: %w", errInvalid, err)
}

// comm returns the communicator h names. Before gorun_init (or after
// gorun_finalize) only a borrowed one is usable.
func (r *registry) comm(h int64) (*commEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.comms.Get(h)
	if r.sess == nil && !(err == nil && e.borrowed) {
		return nil, errNotInit
	}
	if err != nil {
		return nil, invalidHandle(err)
	}
	return e, nil
}

func (r *registry) req(h int64) (*reqEntry, error) {
	e, err := r.reqs.Get(h)
	if err != nil {
		return nil, invalidHandle(err)
	}
	return e, nil
}
