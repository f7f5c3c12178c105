package model

import (
	"errors"
	"fmt"
)

// Activation names the MLP nonlinearity.
type Activation string

const (
	// GELU is the tanh approximation used by GPT-2.
	GELU Activation = "gelu"
	// ReLU is max(0, x).
	ReLU Activation = "relu"
)

// Config sizes the network. All fields are required to be positive; use
// [DefaultConfig] and change what you need.
type Config struct {
	// Vocab is the number of distinct tokens; it sizes the embedding and the
	// output head.
	Vocab int
	// SeqLen is the number of tokens per sample (the context length).
	SeqLen int
	// Dim is the width of the residual stream.
	Dim int
	// Heads is the number of attention heads; Dim must be a multiple of it.
	Heads int
	// Layers is the number of transformer blocks (regions "layers.0" …).
	Layers int
	// Hidden is the MLP's inner width (4×Dim in GPT-2).
	Hidden int
	// Activation is the MLP nonlinearity.
	Activation Activation
	// LNEps is added to the variance in every LayerNorm.
	LNEps float32
	// InitStd is the standard deviation of the initial weights; the output
	// projections of attention and MLP are further scaled by 1/sqrt(2·Layers)
	// so the residual stream does not grow with depth (GPT-2's rule).
	InitStd float32
	// Seed makes parameter initialisation reproducible: the same Seed and
	// sizes give the same bits on every rank and every run.
	Seed uint64
}

// DefaultConfig is small enough that one training step of a global batch of
// 16 samples on 4 ranks sharing 2 cores takes tens of milliseconds, and large
// enough that the loss on [Dataset] falls visibly within 50 steps.
func DefaultConfig() Config {
	return Config{
		Vocab:      32,   // the dataset's alphabet; small keeps the head cheap
		SeqLen:     32,   // long enough that attention must look back several steps
		Dim:        32,   // 4 heads of 8; a step of 4 samples is ~10 MFLOP per sample
		Heads:      4,    // multi-head, so the head split is exercised
		Layers:     4,    // enough regions for bucketing and overlap to matter
		Hidden:     128,  // GPT-2's 4×Dim
		Activation: GELU, // what transformers use
		LNEps:      1e-5, // PyTorch's LayerNorm default
		InitStd:    0.02, // GPT-2's initialisation
		Seed:       1,
	}
}

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns.
var ErrInvalidConfig = errors.New("model: invalid config")

// Validate reports the first field that cannot work.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Vocab < 2:
		return bad("Vocab = %d, need at least 2", c.Vocab)
	case c.SeqLen < 1:
		return bad("SeqLen = %d, need at least 1", c.SeqLen)
	case c.Dim < 1:
		return bad("Dim = %d, need at least 1", c.Dim)
	case c.Heads < 1:
		return bad("Heads = %d, need at least 1", c.Heads)
	case c.Dim%c.Heads != 0:
		return bad("Dim = %d is not a multiple of Heads = %d", c.Dim, c.Heads)
	case c.Layers < 0:
		return bad("Layers = %d, need at least 0", c.Layers)
	case c.Hidden < 1:
		return bad("Hidden = %d, need at least 1", c.Hidden)
	case c.Activation != GELU && c.Activation != ReLU:
		return bad("Activation = %q, want %q or %q", c.Activation, GELU, ReLU)
	case !(c.LNEps > 0):
		return bad("LNEps = %v, need > 0", c.LNEps)
	case !(c.InitStd > 0):
		return bad("InitStd = %v, need > 0", c.InitStd)
	}
	// Guard the int arithmetic of buffer sizes against overflow on absurd
	// inputs rather than failing later with a makeslice panic.
	const limit = 1 << 31
	if int64(c.Vocab)*int64(c.Dim) > limit || int64(c.Hidden)*int64(c.Dim) > limit ||
		int64(c.SeqLen)*int64(c.SeqLen)*int64(c.Heads) > limit || int64(c.SeqLen)*int64(c.Vocab) > limit {
		return bad("sizes too large (Vocab=%d SeqLen=%d Dim=%d Hidden=%d)", c.Vocab, c.SeqLen, c.Dim, c.Hidden)
	}
	return nil
}
