//go:build cgo

package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/overlap"
)

func TestEnterKeepsThePlansRegionOrder(t *testing.T) {
	e := &execEntry{regions: []string{"tok", "blocks.0", "blocks.1", "head"}, pos: map[string]int{}}
	for i, r := range e.regions {
		e.pos[r] = i
	}
	// In order, with a region skipped: accepted.
	for _, r := range []string{"tok", "blocks.1", "head"} {
		if err := e.enterLocked(r); err != nil {
			t.Fatalf("enter %s: %v", r, err)
		}
	}
	e.next, e.last = 0, "" // a new step (gorun_executor_begin)
	for _, tc := range []struct {
		enter []string
		want  string
	}{
		{[]string{"blocks.1", "blocks.0"}, `region "blocks.0" entered out of the plan's order: it is region 2 of 4, and region "blocks.1" came before it`},
		{[]string{"tok", "tok"}, `region "tok" entered out of the plan's order`},
		{[]string{"lm_head"}, `region "lm_head" is not in the plan (its regions: tok, blocks.0, blocks.1, head)`},
	} {
		e.next, e.last = 0, ""
		var err error
		for _, r := range tc.enter {
			if err = e.enterLocked(r); err != nil {
				break
			}
		}
		if err == nil || !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("enter %v: got %v, want an invalid-argument error containing %q", tc.enter, err, tc.want)
		}
	}
}

func TestExecConfig(t *testing.T) {
	cfg, err := parseExecConfig("trace=1 flush=1 check=0 mode=serial")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Trace || !cfg.FlushPartial || cfg.CheckPlan || cfg.Mode != overlap.Serial {
		t.Errorf("parsed %+v", cfg)
	}
	if cfg, _ := parseExecConfig(""); !cfg.CheckPlan || cfg.Mode != overlap.Native {
		t.Errorf("defaults: %+v", cfg)
	}
	for in, want := range map[string]string{
		"trace=yes":    `trace="yes": want 0 or 1`,
		"speed=1":      `unknown key "speed"`,
		"mode=grouped": `mode="grouped": want native or serial`,
		"trace":        `"trace": want key=value`,
	} {
		if _, err := parseExecConfig(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", in, err, want)
		}
	}
}
