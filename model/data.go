package model

import "fmt"

// Dataset is the trainer's synthetic task: arithmetic progressions modulo
// Vocab. Each sample starts at a random token x0 and steps by a random
// stride k in [1, MaxStride]: x_t = (x0 + t·k) mod Vocab. The model predicts
// x_{t+1} from x_0 … x_t. The first prediction is a guess among MaxStride
// tokens at best; every later one is determined by the context, but only if
// the model attends back to infer k — so the loss falls quickly from
// ln(Vocab) to about ln(MaxStride) (the bigram structure) and then further as
// attention learns the stride.
//
// Sample g is a pure function of (Seed, g), so any rank can generate any
// slice of any global batch and the data do not depend on the rank count.
type Dataset struct {
	// Vocab and SeqLen must match the model's Config.
	Vocab, SeqLen int
	// MaxStride bounds the per-sample stride; 1 makes the task a pure bigram.
	MaxStride int
	// Seed selects the stream of samples (independent of the model's Seed).
	Seed uint64
}

// NewDataset returns the dataset matched to cfg: strides up to 3, seeded by
// cfg.Seed.
func NewDataset(cfg Config) Dataset {
	return Dataset{Vocab: cfg.Vocab, SeqLen: cfg.SeqLen, MaxStride: 3, Seed: cfg.Seed}
}

// Validate reports sizes that cannot generate samples.
func (d Dataset) Validate() error {
	if d.Vocab < 2 || d.SeqLen < 1 || d.MaxStride < 1 {
		return fmt.Errorf("%w: dataset Vocab=%d SeqLen=%d MaxStride=%d", ErrInvalidConfig, d.Vocab, d.SeqLen, d.MaxStride)
	}
	return nil
}

// Sample writes global sample g into inputs and targets (SeqLen each).
func (d Dataset) Sample(g uint64, inputs, targets []int32) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if len(inputs) != d.SeqLen || len(targets) != d.SeqLen {
		return fmt.Errorf("%w: sample buffers of %d and %d tokens, want %d", ErrBufferSize, len(inputs), len(targets), d.SeqLen)
	}
	// Mix the index in before the first output so neighbouring samples are
	// unrelated streams.
	r := newRNG(d.Seed*0x9e3779b97f4a7c15 ^ (g+1)*0xd1b54a32d192ed03)
	r.next()
	x0, k := r.intn(d.Vocab), 1+r.intn(d.MaxStride)
	for t := 0; t < d.SeqLen; t++ {
		inputs[t] = int32((x0 + t*k) % d.Vocab)
		targets[t] = int32((x0 + (t+1)*k) % d.Vocab)
	}
	return nil
}

// Batch writes samples [lo, hi) of the global batch of the given step —
// global sample indices step·batch+lo … step·batch+hi−1 — into inputs and
// targets, [hi−lo, SeqLen] each, ready for Workspace.SetBatch.
func (d Dataset) Batch(step, batch, lo, hi int, inputs, targets []int32) error {
	if step < 0 || batch < 1 || lo < 0 || hi > batch || lo >= hi {
		return fmt.Errorf("%w: step %d, samples [%d, %d) of a batch of %d", ErrSampleRange, step, lo, hi, batch)
	}
	T := d.SeqLen
	if len(inputs) != (hi-lo)*T || len(targets) != (hi-lo)*T {
		return fmt.Errorf("%w: batch buffers of %d and %d tokens, want %d", ErrBufferSize, len(inputs), len(targets), (hi-lo)*T)
	}
	for i := lo; i < hi; i++ {
		j := i - lo
		if err := d.Sample(uint64(step)*uint64(batch)+uint64(i), inputs[j*T:(j+1)*T], targets[j*T:(j+1)*T]); err != nil {
			return err
		}
	}
	return nil
}

// SampleRange returns the global sample indices [lo, hi) (within one step's
// batch) that chunk c of rank k holds, when a batch of batch samples is split
// over ranks ranks and each rank's share into chunks chunks. All three counts
// must be powers of two with ranks×chunks dividing batch.
//
// Rank-major (chunkMajor false) gives each rank one contiguous slice, cut
// into chunks: rank k holds [k·n, (k+1)·n), n = batch/ranks. Use it when the
// chunks' gradients are combined locally (TreeSum) before one cross-rank
// reduction per region.
//
// Chunk-major (chunkMajor true) makes the chunk the top level of the sample
// tree: chunk c of every rank lies in [c·batch/chunks, (c+1)·batch/chunks),
// rank k holding the k-th slice of it. Use it when each chunk's gradient is
// reduced across ranks on its own (its collective overlapping the next
// chunk's compute) and the chunk sums are then combined with TreeSum: the
// cross-rank reduction of a chunk is then a node of the same pairwise tree
// over global sample index, so the result is bitwise the rank-major one.
func SampleRange(batch, ranks, rank, chunks, chunk int, chunkMajor bool) (lo, hi int, err error) {
	pow2 := func(x int) bool { return x > 0 && x&(x-1) == 0 }
	if !pow2(batch) || !pow2(ranks) || !pow2(chunks) || batch%(ranks*chunks) != 0 ||
		rank < 0 || rank >= ranks || chunk < 0 || chunk >= chunks {
		return 0, 0, fmt.Errorf("%w: chunk %d of %d on rank %d of %d, batch %d (counts must be powers of two, ranks×chunks dividing the batch)",
			ErrSampleRange, chunk, chunks, rank, ranks, batch)
	}
	cs := batch / (ranks * chunks)
	if chunkMajor {
		lo = chunk*(batch/chunks) + rank*cs
	} else {
		lo = rank*(batch/ranks) + chunk*cs
	}
	return lo, lo + cs, nil
}
