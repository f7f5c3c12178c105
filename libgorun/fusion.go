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
	return issue(h, "allreduce_coalesced", req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
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
		sb, rb := make([]comm.Buffer, n), make([]comm.Buffer, n)
		// Per vector, on the path of every coalesced call (torch's carry
		// dozens of tensors): a vector's name is formatted only for its
		// error, and an in-place vector (send and recv the same memory, as
		// torch's are) is viewed once.
		for i := range int(n) {
			if sb[i], err = buffer(ss[i], cs[i], dt, "", false); err != nil {
				_, err = buffer(ss[i], cs[i], dt, fmt.Sprintf("sends[%d]", i), false)
				return nil, err
			}
			if rs[i] == ss[i] {
				rb[i] = sb[i]
			} else if rb[i], err = buffer(rs[i], cs[i], dt, "", false); err != nil {
				_, err = buffer(rs[i], cs[i], dt, fmt.Sprintf("recvs[%d]", i), false)
				return nil, err
			}
		}
		return e.c.AllReduceCoalesced(ctx, sb, rb, o), nil
	})
}
