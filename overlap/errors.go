package overlap

import (
	"errors"
	"fmt"
	"github.com/gorun-hpc/gorun/buckets"
	"strings"
)

var (
	// ErrConfig is wrapped by Config.Validate's errors.
	ErrConfig = errors.New("overlap: bad config")
	// ErrPlan is wrapped when a plan cannot be executed (unknown group,
	// unsupported op or dtype, a reduce-scatter member not divisible by the
	// group size).
	ErrPlan = errors.New("overlap: cannot execute plan")
	// ErrUsage is wrapped when the program calls the executor out of order:
	// an unknown tensor, a tensor handed in twice, a wait before its bucket
	// could start, a step begun before the last one finished.
	ErrUsage = errors.New("overlap: usage")
	// ErrIncomplete is wrapped by *IncompleteError.
	ErrIncomplete = errors.New("overlap: bucket never filled")
	// ErrPlanMismatch is wrapped by *PlanMismatchError.
	ErrPlanMismatch = errors.New("overlap: ranks disagree on the plan")
)

// IncompleteError is a bucket that could not start because members were
// never handed in this step.
type IncompleteError struct {
	Step    int
	Group   string
	Bucket  string
	Region  string
	Missing []string // tensors not produced, in bucket order
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("overlap: step %d: bucket %q (group %s, region %s) never filled: tensor %s not produced this step",
		e.Step, e.Bucket, e.Group, e.Region, strings.Join(quoteAll(e.Missing), ", "))
}

// Unwrap gives both this package's sentinel and the bucket filler's.
func (e *IncompleteError) Unwrap() []error { return []error{ErrIncomplete, buckets.ErrUnfilled} }

// PlanMismatchError says which ranks ran which plan at a step.
type PlanMismatchError struct {
	Step  int
	Group string
	// Hashes[r] is the plan-and-step hash rank r contributed.
	Hashes []uint64
	// Rank is this rank; Others are the ranks whose hash differs from it.
	Rank   int
	Others []int
}

func (e *PlanMismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "overlap: step %d, group %s: ranks disagree on the bucket plan (rank %d has %016x;", e.Step, e.Group, e.Rank, e.Hashes[e.Rank])
	for _, r := range e.Others {
		fmt.Fprintf(&b, " rank %d has %016x;", r, e.Hashes[r])
	}
	b.WriteString(" every rank must bucket the same tensors in the same order)")
	return b.String()
}

func (e *PlanMismatchError) Unwrap() error { return ErrPlanMismatch }

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
