//go:build cgo

package main

/*
#include <stdint.h>
#define GORUN_NO_PROTOTYPES
#include "gorun.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gorun-hpc/gorun/comm"
)

// Flight record labels (gorun.h, "labels"): a binding names its own API
// call ("all_reduce_coalesced") in the flight records of the collectives it
// issues. gorun_label turns a name into a small number once; each call then
// carries that number in its dtype argument's bits 8-23 (GORUN_LABELED), so
// labelling costs no extra call and no lock, and a call from one thread
// cannot take the label another thread meant for its own.

// labelCtx is a label's two contexts, made once: plain (a request) and under
// comm.IssuerWaits (a call the issuer waits for), so issuing allocates none.
type labelCtx struct{ plain, waits context.Context }

var labelCtxs struct {
	mu sync.Mutex                 // orders writers
	by atomic.Pointer[[]labelCtx] // by comm.Label; copied on write, read without a lock
}

//export gorun_label
func gorun_label(name *C.char, out *C.int) (rc C.int) {
	defer guard(&rc)
	if name == nil || out == nil {
		return setErr(fmt.Errorf("%w: gorun_label: name or out is NULL", errInvalid), nil)
	}
	l, err := registerLabel(C.GoString(name))
	if err != nil {
		return setErr(fmt.Errorf("gorun_label: %w", err), nil)
	}
	*out = C.int(l)
	return ok()
}

// registerLabel is gorun_label: the label of name, and its contexts made.
func registerLabel(name string) (comm.Label, error) {
	l, err := comm.RegisterLabel(name)
	if err != nil {
		return 0, err
	}
	labelCtxs.mu.Lock()
	defer labelCtxs.mu.Unlock()
	var cur []labelCtx
	if p := labelCtxs.by.Load(); p != nil {
		cur = *p
	}
	if int(l) >= len(cur) || cur[l].plain == nil {
		next := make([]labelCtx, max(len(cur), int(l)+1))
		copy(next, cur)
		plain := comm.WithLabel(context.Background(), l)
		next[l] = labelCtx{plain, comm.IssuerWaits(plain)}
		labelCtxs.by.Store(&next)
	}
	return l, nil
}

// takeLabel splits a dtype argument into the label in its bits 8-23, which
// it returns, and the dtype itself, which it leaves in *dt (splitLabel).
func takeLabel(dt *C.int) comm.Label {
	l, v := splitLabel(int32(*dt))
	*dt = C.int(v)
	return l
}

// splitLabel splits v into the label in its bits 8-23 and the rest. A value
// with bits above 23, or a negative one, is left whole for dtypeOp to
// refuse.
func splitLabel(v int32) (comm.Label, int32) {
	if v < 0 || v>>24 != 0 {
		return 0, v
	}
	return comm.Label(v >> 8), v & 0xff
}

// issueCtx is the context issue gives a call: labelled when l is not 0, and
// under comm.IssuerWaits when the issuer waits for it.
func issueCtx(l comm.Label, waits bool) (context.Context, error) {
	if l == 0 {
		if waits {
			return comm.IssuerWaits(context.Background()), nil
		}
		return context.Background(), nil
	}
	p := labelCtxs.by.Load()
	if p == nil || int(l) >= len(*p) || (*p)[l].plain == nil {
		return nil, fmt.Errorf("%w: label %d in the dtype argument was not made by gorun_label", errInvalid, l)
	}
	if waits {
		return (*p)[l].waits, nil
	}
	return (*p)[l].plain, nil
}
