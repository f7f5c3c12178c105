//go:build cgo

package main

/*
#include <stddef.h>
#define GORUN_NO_PROTOTYPES
#include "gorun.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// gorun_allreduce_coalesced is comm's AllReduceCoalesced: n vectors in one
// call (one request), fused on the wire where small. sends, recvs and
// counts are C arrays of n entries, read during the call only.
//
//export gorun_allreduce_coalesced
func gorun_allreduce_coalesced(h C.gorun_comm_t, sends *unsafe.Pointer, recvs *unsafe.Pointer, counts *C.size_t, n C.int, dtype, op C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "allreduce_coalesced", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, o, err := dtypeOp(dtype, op)
		if err != nil {
			return nil, err
		}
		switch {
		case o == 0:
			return nil, fmt.Errorf("%w: op 0", errInvalid)
		case n < 1:
			return nil, fmt.Errorf("%w: n is %d (at least one vector)", errInvalid, n)
		case sends == nil || recvs == nil || counts == nil:
			return nil, fmt.Errorf("%w: sends, recvs or counts is NULL", errInvalid)
		}
		ss, rs, cs := unsafe.Slice(sends, int(n)), unsafe.Slice(recvs, int(n)), unsafe.Slice(counts, int(n))
		// Per vector, on the path of every coalesced call (torch's carry
		// dozens of tensors): the views are made in two allocations for all
		// of them (comm.BytesN), a vector's name is formatted only for its
		// error, and in-place vectors (every send its recv, as torch's are)
		// are viewed once.
		sb, err := comm.BytesN(dt, int(n), func(i int) ([]byte, error) { return vectorBytes(ss[i], cs[i], dt, "sends", i) })
		if err != nil {
			return nil, err
		}
		rb := sb
		for i := range rs {
			if rs[i] != ss[i] {
				if rb, err = comm.BytesN(dt, int(n), func(i int) ([]byte, error) {
					return vectorBytes(rs[i], cs[i], dt, "recvs", i)
				}); err != nil {
					return nil, err
				}
				break
			}
		}
		return e.c.AllReduceCoalesced(ctx, sb, rb, o), nil
	})
}

// vectorBytes is buffer's check and view of one vector of a call of
// several, as bytes: count elements of dt at p (NULL only with count 0),
// or an error naming name[i].
func vectorBytes(p unsafe.Pointer, count C.size_t, dt comm.DType, name string, i int) ([]byte, error) {
	if p == nil {
		if count != 0 {
			return nil, fmt.Errorf("%w: %s[%d] is NULL with count %d", errInvalid, name, i, count)
		}
		return []byte{}, nil
	}
	es := uint64(dt.Size())
	if uint64(count) > math.MaxInt/es {
		return nil, fmt.Errorf("%w: %s[%d]: count %d is too large", errInvalid, name, i, count)
	}
	return unsafe.Slice((*byte)(p), int(uint64(count)*es)), nil
}
