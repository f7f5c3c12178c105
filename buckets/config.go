package buckets

import (
	"errors"
	"fmt"
)

// Config is what every bucketing decision needs: the cost model and the
// bounds derived from it. The zero value of a size means "derive it from the
// model", so a Config filled from `gorun bench` measurements only needs Model.
type Config struct {
	// Model estimates collective times; default DefaultModel (TCP anchors).
	Model Model
	// CapBytes bounds a bucket's fused buffer. Zero: Model.CapBytes(), the
	// size past which merging gains < 5% bandwidth and only delays the start.
	CapBytes int64
	// MinBytes is the size below which a bucket is latency-bound. The
	// overlap-preserving pass keeps growing hidden buckets up to it (they
	// still occupy the comm stream) but leaves larger hidden ones alone.
	// Zero: Model.MinBucketBytes().
	MinBytes int64
	// SearchLimit bounds how many merge attempts the overlap-preserving pass
	// makes per collective, which bounds planning time at O(n·SearchLimit)
	// after one sort. Default 16: runs of more mergeable neighbours than that
	// are rare, and a missed merge costs one latency, not correctness.
	SearchLimit int
}

// DefaultConfig derives everything from DefaultModel.
func DefaultConfig() Config {
	return Config{Model: DefaultModel(), SearchLimit: 16}
}

// LocalConfig derives everything from LocalModel, for tests and laptops.
func LocalConfig() Config {
	return Config{Model: LocalModel(), SearchLimit: 16}
}

// ErrBadConfig is returned by Config.Validate.
var ErrBadConfig = errors.New("buckets: bad config")

// Validate reports a config that cannot be used.
func (c Config) Validate() error {
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if c.CapBytes < 0 || c.MinBytes < 0 {
		return fmt.Errorf("%w: negative size (cap %d, min %d)", ErrBadConfig, c.CapBytes, c.MinBytes)
	}
	if c.SearchLimit < 0 {
		return fmt.Errorf("%w: negative search limit %d", ErrBadConfig, c.SearchLimit)
	}
	if c.CapBytes > 0 && c.MinBytes > c.CapBytes {
		return fmt.Errorf("%w: min bytes %d above cap %d", ErrBadConfig, c.MinBytes, c.CapBytes)
	}
	return nil
}

// Cap returns CapBytes, or the model's cap when it is zero.
func (c Config) Cap() int64 {
	if c.CapBytes > 0 {
		return c.CapBytes
	}
	return c.Model.CapBytes()
}

// Min returns MinBytes, or the model's minimum when it is zero, never above
// Cap.
func (c Config) Min() int64 {
	m := c.MinBytes
	if m == 0 {
		m = c.Model.MinBucketBytes()
	}
	return min(m, c.Cap())
}

// Limit returns SearchLimit, or 16 when it is zero.
func (c Config) Limit() int {
	if c.SearchLimit > 0 {
		return c.SearchLimit
	}
	return 16
}

// Pack splits a run of sizes, in order, into consecutive buckets of at most
// capBytes each (a single item larger than the cap gets a bucket of its own)
// and returns each bucket as the half-open index range [lo, hi). Greedy
// first-fit in order is what DDP does and is optimal for consecutive packing
// of a fixed order: it minimises the number of buckets.
func Pack(sizes []int64, capBytes int64) [][2]int {
	var out [][2]int
	lo, sum := 0, int64(0)
	for i, s := range sizes {
		if i > lo && sum+s > capBytes {
			out = append(out, [2]int{lo, i})
			lo, sum = i, 0
		}
		sum += s
	}
	if lo < len(sizes) {
		out = append(out, [2]int{lo, len(sizes)})
	}
	return out
}
