//go:build cgo

package main

/*
#include <stdint.h>
#include <stdlib.h>
#define GORUN_NO_PROTOTYPES
#include "gorun.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/handles"
)

// Receives from any source: gorun.h's matchers, over comm.Matcher.

// matchers holds the live matchers by handle.
var matchers = handles.New[*comm.Matcher]("matcher", "freed, or never made")

func matcher(h C.gorun_matcher_t, what string) (*comm.Matcher, error) {
	m, err := matchers.Get(int64(h))
	if err != nil {
		return nil, fmt.Errorf("%w: gorun_%s: %w", errInvalid, what, err)
	}
	return m, nil
}

//export gorun_matcher_new
func gorun_matcher_new(out *C.gorun_matcher_t) (rc C.int) {
	defer guard(&rc)
	if out == nil {
		return setErr(fmt.Errorf("%w: gorun_matcher_new: out is NULL", errInvalid), nil)
	}
	*out = C.gorun_matcher_t(matchers.Add(comm.NewMatcher()))
	return ok()
}

//export gorun_matcher_add
func gorun_matcher_add(m C.gorun_matcher_t, id C.int, h C.gorun_comm_t, peer C.int) (rc C.int) {
	defer guard(&rc)
	mt, err := matcher(m, "matcher_add")
	if err != nil {
		return setErr(err, nil)
	}
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(fmt.Errorf("gorun_matcher_add: %w", err), nil)
	}
	if err := mt.Add(int(id), e.c, int(peer)); err != nil {
		return setErr(fmt.Errorf("gorun_matcher_add: %w", err), e)
	}
	return ok()
}

//export gorun_matcher_recv
func gorun_matcher_recv(m C.gorun_matcher_t, buf unsafe.Pointer, count C.size_t, dtype, from C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	mt, err := matcher(m, "matcher_recv")
	if err != nil {
		return setErr(err, nil)
	}
	dt, _, err := dtypeOp(dtype, 0)
	if err != nil {
		return setErr(fmt.Errorf("gorun_matcher_recv: %w", err), nil)
	}
	if from < C.GORUN_ANY_SOURCE {
		return setErr(fmt.Errorf("%w: gorun_matcher_recv: source %d (an id, or GORUN_ANY_SOURCE)", errInvalid, from), nil)
	}
	b, err := buffer(buf, count, dt, "buf", false)
	if err != nil {
		return setErr(fmt.Errorf("gorun_matcher_recv: %w", err), nil)
	}
	r := mt.Recv(context.Background(), b, int(from))
	if req == nil {
		if err := r.Wait(context.Background()); err != nil {
			return setErr(err, nil)
		}
		return ok()
	}
	*req = C.gorun_request_t(reg.reqs.Add(&reqEntry{h: r, what: "recv from any source"}))
	return ok()
}

//export gorun_request_source
func gorun_request_source(r C.gorun_request_t, id *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := reg.req(int64(r))
	if err != nil {
		return setErr(err, nil)
	}
	mr, isMatched := e.h.(*comm.MatchedRecv)
	switch {
	case id == nil:
		return setErr(fmt.Errorf("%w: gorun_request_source: id is NULL", errInvalid), nil)
	case !isMatched:
		return setErr(fmt.Errorf("%w: gorun_request_source: request %d is a %s, not a matcher's receive", errInvalid, r, e.what), nil)
	case mr.Source() < 0:
		return setErr(fmt.Errorf("%w: gorun_request_source: the receive has no message yet", errInvalid), nil)
	}
	*id = C.int(mr.Source())
	return ok()
}

//export gorun_matcher_free
func gorun_matcher_free(m C.gorun_matcher_t) (rc C.int) {
	defer guard(&rc)
	mt, err := matchers.Take(int64(m))
	if err != nil {
		return setErr(fmt.Errorf("%w: gorun_matcher_free: %w", errInvalid, err), nil)
	}
	mt.Close()
	return ok()
}

// closeMatchers frees every matcher left (finalize), before the
// communicators they read from are closed.
func closeMatchers() {
	for _, mt := range matchers.TakeAll() {
		mt.Close()
	}
}
