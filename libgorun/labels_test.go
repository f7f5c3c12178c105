//go:build cgo

package main

import (
	"errors"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// A dtype argument carries a label in bits 8-23 (GORUN_LABELED); a call's
// context carries the label gorun_label made, and a label it did not make
// is refused, not recorded under no name.
func TestLabelInDtype(t *testing.T) {
	l, err := registerLabel("reduce_scatter_tensor")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in    int32
		label comm.Label
		dt    int32
	}{
		{1, 0, 1},                  // no label: as before
		{1 | int32(l)<<8, l, 1},    // GORUN_LABELED(GORUN_FLOAT32, l)
		{8 | 0xffff<<8, 0xffff, 8}, // the largest label
		{1 << 24, 0, 1 << 24},      // bits above 23: left for dtypeOp to refuse
		{-1, 0, -1},                // negative: the same
	} {
		if gl, gd := splitLabel(c.in); gl != c.label || gd != c.dt {
			t.Errorf("splitLabel(%#x) = %d, %#x; want %d, %#x", c.in, gl, gd, c.label, c.dt)
		}
	}
	for _, waits := range []bool{false, true} {
		if _, err := issueCtx(l, waits); err != nil {
			t.Errorf("waits=%v: label %d: %v", waits, l, err)
		}
		if _, err := issueCtx(0, waits); err != nil {
			t.Errorf("waits=%v: no label: %v", waits, err)
		}
		if _, err := issueCtx(l+100, waits); !errors.Is(err, errInvalid) {
			t.Errorf("waits=%v: a label gorun_label never made: err %v, want errInvalid", waits, err)
		}
	}
}
