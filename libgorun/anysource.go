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
	"sync"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// Receives from any source: gorun.h's matchers, over comm.Matcher.

// matchers holds the live matchers by handle; handles are never reused.
var matchers = struct {
	mu   sync.Mutex
	next int64
	m    map[int64]*comm.Matcher
}{m: map[int64]*comm.Matcher{}}

func matcher(h C.gorun_matcher_t, what string) (*comm.Matcher, error) {
	matchers.mu.Lock()
	defer matchers.mu.Unlock()
	m, ok := matchers.m[int64(h)]
	if !ok {
		return nil, fmt.Errorf("%w: gorun_%s: no matcher %d (freed, or never made)", errInvalid, what, h)
	}
	return m, nil
}

//export gorun_matcher_new
func gorun_matcher_new(out *C.gorun_matcher_t) (rc C.int) {
	defer guard(&rc)
	if out == nil {
		return setErr(fmt.Errorf("%w: gorun_matcher_new: out is NULL", errInvalid), nil)
	}
	matchers.mu.Lock()
	matchers.next++
	matchers.m[matchers.next] = comm.NewMatcher()
	*out = C.gorun_matcher_t(matchers.next)
	matchers.mu.Unlock()
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
	*req = C.gorun_request_t(reg.addReq(&reqEntry{h: r, what: "recv from any source"}))
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
	matchers.mu.Lock()
	mt, found := matchers.m[int64(m)]
	delete(matchers.m, int64(m))
	matchers.mu.Unlock()
	if !found {
		return setErr(fmt.Errorf("%w: gorun_matcher_free: no matcher %d", errInvalid, m), nil)
	}
	mt.Close()
	return ok()
}

// closeMatchers frees every matcher left (finalize), before the
// communicators they read from are closed.
func closeMatchers() {
	matchers.mu.Lock()
	all := matchers.m
	matchers.m = map[int64]*comm.Matcher{}
	matchers.mu.Unlock()
	for _, mt := range all {
		mt.Close()
	}
}
