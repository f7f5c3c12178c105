package overlap

import (
	"fmt"
	"time"
)

// StepMetrics is what one step cost.
type StepMetrics struct {
	Step int
	// Time is Begin to the end of Finish.
	Time time.Duration
	// Compute is the time spent inside Compute callbacks.
	Compute time.Duration
	// Comm is the time the groups' communication streams were busy: for each
	// collective, from when it was issued (or the previous one on its group
	// completed, if later) to when it completed, summed over collectives.
	Comm time.Duration
	// Exposed is the time the program spent blocked in waits (Wait, Finish,
	// Serial mode): communication that compute did not hide.
	Exposed time.Duration
	// Collectives and Bytes count the buckets issued and their fused input
	// bytes (the plan-hash exchange is not counted).
	Collectives int
	Bytes       int64
	// PeakBytes is the most bytes of collective outputs held at once
	// (GraphRunner only; see stepgraph.PeakCollectiveBytes for the plan's
	// estimate of the same quantity).
	PeakBytes int64
	// FusedPeakBytes is the most bytes of the executor's fused bucket
	// buffers allocated at once: they exist from a bucket's first packed
	// member to its wait (buckets of one member use the member's own
	// memory and have none).
	FusedPeakBytes int64
	// CopiedBytes counts the bytes the executor copied between members'
	// buffers and fused bucket buffers (packing inputs, scattering
	// results). Buckets whose members live in the bucket (Executor.View,
	// GraphRunner.View) and buckets of one member copy nothing: a step
	// with only those has CopiedBytes 0, the zero-copy promise.
	CopiedBytes int64
}

// ExposedFraction is Exposed/Comm, 0 when there was no communication. It can
// exceed 1 slightly: a wait also covers the time to notice completion.
func (m StepMetrics) ExposedFraction() float64 {
	if m.Comm <= 0 {
		return 0
	}
	return float64(m.Exposed) / float64(m.Comm)
}

// Add accumulates o into m (for run totals; PeakBytes keeps the largest);
// Step is left alone.
func (m *StepMetrics) Add(o StepMetrics) {
	m.Time += o.Time
	m.Compute += o.Compute
	m.Comm += o.Comm
	m.Exposed += o.Exposed
	m.Collectives += o.Collectives
	m.Bytes += o.Bytes
	m.PeakBytes = max(m.PeakBytes, o.PeakBytes)
	m.FusedPeakBytes = max(m.FusedPeakBytes, o.FusedPeakBytes)
	m.CopiedBytes += o.CopiedBytes
}

func (m StepMetrics) String() string {
	return fmt.Sprintf("step %d: time %v compute %v comm %v exposed %v (%.1f%%) in %d collectives, %d bytes, peak %d bytes held",
		m.Step, m.Time, m.Compute, m.Comm, m.Exposed, 100*m.ExposedFraction(), m.Collectives, m.Bytes, m.PeakBytes)
}
