package model

// rng is SplitMix64: tiny, fast, and — unlike a library generator whose
// algorithm could change between Go releases — fixed by this file, so
// initial parameters and data never change under a toolchain upgrade.
type rng struct{ s uint64 }

func newRNG(seed uint64) *rng { return &rng{s: seed} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float64 is uniform in [0, 1) with 53 random bits.
func (r *rng) float64() float64 { return float64(r.next()>>11) / (1 << 53) }

// sym is uniform in [-1, 1) with 54 random bits, computed exactly in integers
// so no platform can round it differently.
func (r *rng) sym() float64 {
	return float64(int64(r.next()>>10)-(1<<53)) / (1 << 53)
}

// intn is uniform in [0, n) for n ≥ 1 (the modulo bias is negligible for the
// small n used here and, more to the point, deterministic).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }
