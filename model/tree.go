package model

import "fmt"

// TreeSum writes into dst the sum of parts by the pairwise tree over part
// index: parts[0]+parts[1], parts[2]+parts[3], then those sums pairwise, and
// so on. For a power-of-two count this is the same tree [Workspace.Backward]
// uses over samples, so if rank k of N holds the k-th contiguous slice of the
// global batch, TreeSum over the ranks' partial sums in rank order equals the
// single-rank result bit for bit.
//
// It is the in-process model of the cross-rank levels: a deterministic
// all-reduce or reduce-scatter that reduces pairwise in rank order computes
// exactly this. Use it in tests, and to combine the partial sums of two
// chunks of one rank's samples (chunk [0, n/2) and [n/2, n)) before the
// cross-rank reduction. For a count that is not a power of two the left part
// is the largest power of two below the count.
//
// All parts must have len(dst) elements. dst may alias parts[0].
func TreeSum(dst []float32, parts ...[]float32) error {
	if len(parts) == 0 {
		return fmt.Errorf("%w: TreeSum of no parts", ErrBufferSize)
	}
	for i, p := range parts {
		if len(p) != len(dst) {
			return fmt.Errorf("%w: TreeSum part %d has %d elements, dst %d", ErrBufferSize, i, len(p), len(dst))
		}
	}
	treeSum(dst, parts)
	return nil
}

// treeSum computes the tree sum of parts into dst. It allocates one buffer
// per right subtree of more than one part; it serves tests and small
// combinations, not the per-step hot path.
func treeSum(dst []float32, parts [][]float32) {
	if len(parts) == 1 {
		copy(dst, parts[0])
		return
	}
	mid := highBit(len(parts) - 1)
	treeSum(dst, parts[:mid])
	if len(parts)-mid == 1 {
		add(dst, parts[mid])
		return
	}
	right := make([]float32, len(dst))
	treeSum(right, parts[mid:])
	add(dst, right)
}

// TreeSumScalars is TreeSum for one number per part, e.g. the ranks' local
// loss sums.
func TreeSumScalars(v ...float32) float32 {
	if len(v) == 0 {
		return 0
	}
	return treeScalar(v)
}

// Mean divides every element by the global batch size, after the whole tree
// (local and cross-rank levels) has summed the per-sample values. Every rank
// count divides the same sum by the same number, so the mean is as
// rank-count independent as the sum; for a power-of-two batch the division is
// exact.
func Mean(buf []float32, batch int) error {
	if batch < 1 {
		return fmt.Errorf("%w: Mean over a batch of %d", ErrSampleRange, batch)
	}
	b := float32(batch)
	for i := range buf {
		buf[i] /= b
	}
	return nil
}
