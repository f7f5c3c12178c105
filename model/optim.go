package model

import (
	"fmt"
	"math"
)

// Algorithm names an optimizer.
type Algorithm string

const (
	// Adam is AdamW: Adam with decoupled weight decay (Loshchilov & Hutter),
	// PyTorch's torch.optim.AdamW update.
	Adam Algorithm = "adam"
	// SGD is stochastic gradient descent with heavy-ball momentum, PyTorch's
	// torch.optim.SGD update (dampening 0, not Nesterov).
	SGD Algorithm = "sgd"
)

// OptimizerConfig selects and tunes the optimizer.
type OptimizerConfig struct {
	// Algorithm is Adam or SGD.
	Algorithm Algorithm
	// LR is the learning rate.
	LR float32
	// Beta1 and Beta2 are Adam's decay rates of the first and second moment.
	Beta1, Beta2 float32
	// Eps is added to Adam's denominator.
	Eps float32
	// Momentum is SGD's momentum factor (0 disables it).
	Momentum float32
	// WeightDecay is decoupled (AdamW) for Adam and L2 (added to the
	// gradient) for SGD, as in PyTorch. It applies to every element, biases
	// and LayerNorm included, because the update must not depend on which
	// tensor an element of a shard belongs to.
	WeightDecay float32
}

// DefaultOptimizerConfig is Adam at a learning rate that makes the default
// model's loss fall visibly within 50 steps on [Dataset].
func DefaultOptimizerConfig() OptimizerConfig {
	return OptimizerConfig{
		Algorithm:   Adam,
		LR:          3e-3,  // high for a transformer, right for a tiny one and a short demo run
		Beta1:       0.9,   // PyTorch default
		Beta2:       0.999, // PyTorch default
		Eps:         1e-8,  // PyTorch default
		Momentum:    0.9,   // used by SGD only
		WeightDecay: 0,     // the demo task does not overfit
	}
}

// Validate reports the first unusable field.
func (c OptimizerConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Algorithm != Adam && c.Algorithm != SGD:
		return bad("Algorithm = %q, want %q or %q", c.Algorithm, Adam, SGD)
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return bad("LR = %v, need a finite value > 0", c.LR)
	case !(c.WeightDecay >= 0):
		return bad("WeightDecay = %v, need >= 0", c.WeightDecay)
	}
	if c.Algorithm == Adam {
		switch {
		case !(c.Beta1 >= 0 && c.Beta1 < 1):
			return bad("Beta1 = %v, need 0 <= Beta1 < 1", c.Beta1)
		case !(c.Beta2 >= 0 && c.Beta2 < 1):
			return bad("Beta2 = %v, need 0 <= Beta2 < 1", c.Beta2)
		case !(c.Eps > 0):
			return bad("Eps = %v, need > 0", c.Eps)
		}
	} else if !(c.Momentum >= 0 && c.Momentum < 1) {
		return bad("Momentum = %v, need 0 <= Momentum < 1", c.Momentum)
	}
	return nil
}

// Optimizer updates flat parameter buffers from flat gradient buffers.
//
// Every update is elementwise: element i of the result depends only on
// element i of the parameters, gradient and state and on the step number.
// So updating a whole region, or each of its shards on a different rank,
// gives the same bits — the property sharded training relies on. The
// Optimizer itself is immutable and safe for concurrent use; the mutable
// state is the caller's OptState, one per buffer (or shard).
type Optimizer struct {
	cfg OptimizerConfig
}

// NewOptimizer validates cfg.
func NewOptimizer(cfg OptimizerConfig) (*Optimizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Optimizer{cfg: cfg}, nil
}

// OptState is the per-element state of one parameter buffer: the first and
// second moment for Adam, the momentum buffer (M) for SGD.
type OptState struct {
	M, V []float32
}

// NewState returns zero state for a buffer of n elements.
func (o *Optimizer) NewState(n int) *OptState {
	st := &OptState{M: make([]float32, n)}
	if o.cfg.Algorithm == Adam {
		st.V = make([]float32, n)
	}
	return st
}

// Update applies one optimizer step to params in place. step is the 1-based
// number of the update (Adam's bias correction depends on it; pass the same
// number for every buffer of one training step). grads must already be the
// mean over the global batch.
func (o *Optimizer) Update(step int, params, grads []float32, st *OptState) error {
	if step < 1 {
		return fmt.Errorf("%w: got %d", ErrStep, step)
	}
	n := len(params)
	if st == nil || len(grads) != n || len(st.M) != n || (o.cfg.Algorithm == Adam && len(st.V) != n) {
		return fmt.Errorf("%w: optimizer update of %d parameters with %d gradients and mismatched or missing state",
			ErrBufferSize, n, len(grads))
	}
	c := o.cfg
	if c.Algorithm == SGD {
		lr, mu, wd := c.LR, c.Momentum, c.WeightDecay
		m := st.M[:n]
		for i, g := range grads {
			p := params[i]
			if wd != 0 {
				g += float32(wd * p)
			}
			b := g
			if mu != 0 {
				if step > 1 {
					b = float32(mu*m[i]) + g
				}
				m[i] = b
			}
			params[i] = p - float32(lr*b)
		}
		return nil
	}
	// Scalars are computed in float64 from the step number and rounded once;
	// every rank computes the same ones.
	bc1 := 1 - math.Pow(float64(c.Beta1), float64(step))
	bc2 := 1 - math.Pow(float64(c.Beta2), float64(step))
	stepSize := float32(float64(c.LR) / bc1)
	invSqrtBc2 := float32(1 / math.Sqrt(bc2))
	decay := float32(1 - float64(c.LR)*float64(c.WeightDecay))
	b1, b2, eps := c.Beta1, c.Beta2, c.Eps
	omb1, omb2 := 1-b1, 1-b2
	m, v := st.M[:n], st.V[:n]
	for i, g := range grads {
		p := params[i]
		if decay != 1 {
			p = float32(p * decay)
		}
		mi := float32(b1*m[i]) + float32(omb1*g)
		vi := float32(b2*v[i]) + float32(float32(omb2*g)*g)
		m[i], v[i] = mi, vi
		denom := float32(float32(math.Sqrt(float64(vi)))*invSqrtBc2) + eps
		params[i] = p - float32(stepSize*mi)/denom
	}
	return nil
}
