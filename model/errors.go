package model

import "errors"

// Sentinel errors. Functions wrap them with %w and the offending values, so
// callers test with errors.Is and users read the details.
var (
	// ErrRegion: a region index or name that the layout does not have.
	ErrRegion = errors.New("model: unknown region")
	// ErrBufferSize: a parameter, gradient or shard buffer shorter than the
	// region (or shard) it stands for, or buffers that disagree in length.
	ErrBufferSize = errors.New("model: buffer size mismatch")
	// ErrSampleRange: a sample range outside the workspace, empty, or — for
	// backward and loss sums — not a node of the pairwise tree (its length a
	// power of two and its start a multiple of its length).
	ErrSampleRange = errors.New("model: bad sample range")
	// ErrOrder: a step called before the steps it depends on, e.g. backward of
	// a block before the block above it, or forward before SetBatch.
	ErrOrder = errors.New("model: step out of order")
	// ErrToken: an input or target token outside [0, Vocab).
	ErrToken = errors.New("model: token out of range")
	// ErrShard: a shard count below 1 or a shard index outside [0, n).
	ErrShard = errors.New("model: bad shard")
	// ErrStep: an optimizer step number below 1.
	ErrStep = errors.New("model: optimizer step must be >= 1")
)
