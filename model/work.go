package model

import (
	"fmt"
	"sync"
)

// work is the engine behind Workspace, generic over the element type so the
// gradient check can run the very same code in float64.
//
// Activations are kept per sample for every region, so that backward of a
// region can run for any sample range after forward, and the per-sample
// gradients can be summed by the pairwise tree over sample index.
type work[F float] struct {
	cfg Config
	lay *Layout
	n   int // samples the workspace holds

	inputs, targets []int32 // [n, T]
	batchSet        bool

	// resid[l] is the input of block l for every sample, [n, T, D];
	// resid[Layers] is the head's input.
	resid [][]F
	blk   []blockCache[F]
	head  headCache[F]
	// dx is the gradient stream [n, T, D]: after backward of region r for a
	// sample, it holds the gradient of the loss with respect to r's input.
	dx   []F
	loss []F // per-sample loss (mean over positions)

	// fwd[r][s] / bwd[r][s]: region r has run forward / backward for sample s
	// since the last SetBatch. They turn call-order mistakes into ErrOrder
	// instead of silently wrong gradients.
	fwd, bwd [][]bool

	// lanes hold the per-goroutine temporaries; lanes[0] is also what a
	// single-threaded workspace uses. See setWorkers.
	lanes []*lane[F]
}

// lane is one worker's private temporaries.
type lane[F float] struct {
	sc   scratch[F]
	tree [][]F // per recursion depth, right-subtree partial sums
	part []F   // this lane's subtree sum when backward is split across lanes
}

// blockCache holds one block's saved activations for all samples; each field
// is n consecutive per-sample slices.
type blockCache[F float] struct {
	xhat1, rstd1, h1, qkv, att, o, xhat2, rstd2, h2, u, f []F
}

type headCache[F float] struct {
	xhat, rstd, h, prob []F
}

// scratch is per-sample temporary space, reused across samples.
type scratch[F float] struct {
	x2, dx2, dh, do_, dqkv, dhid, logits, lnTmp, dp []F
}

func newWork[F float](cfg Config, lay *Layout, n int) *work[F] {
	T, D, H, Hd, V, L := cfg.SeqLen, cfg.Dim, cfg.Heads, cfg.Hidden, cfg.Vocab, cfg.Layers
	w := &work[F]{cfg: cfg, lay: lay, n: n,
		inputs:  make([]int32, n*T),
		targets: make([]int32, n*T),
		dx:      make([]F, n*T*D),
		loss:    make([]F, n),
	}
	for l := 0; l <= L; l++ {
		w.resid = append(w.resid, make([]F, n*T*D))
	}
	w.blk = make([]blockCache[F], L)
	for l := range w.blk {
		w.blk[l] = blockCache[F]{
			xhat1: make([]F, n*T*D), rstd1: make([]F, n*T), h1: make([]F, n*T*D),
			qkv: make([]F, n*T*3*D), att: make([]F, n*H*T*T), o: make([]F, n*T*D),
			xhat2: make([]F, n*T*D), rstd2: make([]F, n*T), h2: make([]F, n*T*D),
			u: make([]F, n*T*Hd), f: make([]F, n*T*Hd),
		}
	}
	w.head = headCache[F]{xhat: make([]F, n*T*D), rstd: make([]F, n*T), h: make([]F, n*T*D), prob: make([]F, n*T*V)}
	w.setWorkers(1)
	R := len(lay.Regions)
	w.fwd = make([][]bool, R)
	w.bwd = make([][]bool, R)
	for r := 0; r < R; r++ {
		w.fwd[r] = make([]bool, n)
		w.bwd[r] = make([]bool, n)
	}
	return w
}

func newLane[F float](cfg Config) *lane[F] {
	T, D, Hd, V := cfg.SeqLen, cfg.Dim, cfg.Hidden, cfg.Vocab
	return &lane[F]{sc: scratch[F]{
		x2: make([]F, T*D), dx2: make([]F, T*D), dh: make([]F, T*D), do_: make([]F, T*D),
		dqkv: make([]F, T*3*D), dhid: make([]F, T*Hd), logits: make([]F, T*V),
		lnTmp: make([]F, D), dp: make([]F, T),
	}}
}

// setWorkers sets how many goroutines forward and backward may use (k ≥ 1).
// The result does not depend on k: every sample is computed by the same code
// whichever goroutine runs it, and backward splits [lo, hi) only into nodes
// of the pairwise tree, whose sums are then combined by the same tree.
func (w *work[F]) setWorkers(k int) {
	k = max(k, 1)
	for len(w.lanes) < k {
		w.lanes = append(w.lanes, newLane[F](w.cfg))
	}
	w.lanes = w.lanes[:k]
}

// split cuts [lo, hi) into at most len(lanes) contiguous pieces for the
// forward pass (any split will do: samples are independent).
func (w *work[F]) split(lo, hi int) [][2]int {
	k := min(len(w.lanes), hi-lo)
	out := make([][2]int, 0, k)
	for i := 0; i < k; i++ {
		out = append(out, [2]int{lo + (hi-lo)*i/k, lo + (hi-lo)*(i+1)/k})
	}
	return out
}

// parallel runs f(i) for i in [0, k) — on the calling goroutine when k is 1,
// else one goroutine each — and returns when all have finished.
func parallel(k int, f func(i int)) {
	if k == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for i := 0; i < k; i++ {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// per returns sample s's slice of a buffer holding n per-sample slices.
func per[F float](buf []F, s, n int) []F {
	k := len(buf) / n
	return buf[s*k : (s+1)*k : (s+1)*k]
}

func (w *work[F]) setBatch(inputs, targets []int32) error {
	T, V := w.cfg.SeqLen, int32(w.cfg.Vocab)
	if len(inputs) != w.n*T || len(targets) != w.n*T {
		return fmt.Errorf("%w: SetBatch got %d inputs and %d targets, want %d samples × %d tokens = %d each",
			ErrBufferSize, len(inputs), len(targets), w.n, T, w.n*T)
	}
	for i := range inputs {
		if inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V {
			return fmt.Errorf("%w: sample %d position %d has input %d target %d, vocab is %d",
				ErrToken, i/T, i%T, inputs[i], targets[i], V)
		}
	}
	copy(w.inputs, inputs)
	copy(w.targets, targets)
	for r := range w.fwd {
		clear(w.fwd[r])
		clear(w.bwd[r])
	}
	w.batchSet = true
	return nil
}

func (w *work[F]) checkRegion(r int) (*Region, error) {
	if r < 0 || r >= len(w.lay.Regions) {
		return nil, fmt.Errorf("%w: index %d, have 0..%d", ErrRegion, r, len(w.lay.Regions)-1)
	}
	return &w.lay.Regions[r], nil
}

// checkRange validates [lo, hi). Tree ranges (backward, loss) must be nodes
// of the pairwise tree, so that their partial sums combine into the global
// tree — or the whole workspace, whose tree is the root for any size.
func (w *work[F]) checkRange(lo, hi int, tree bool) error {
	if lo < 0 || hi > w.n || lo >= hi {
		return fmt.Errorf("%w: [%d, %d) in a workspace of %d samples", ErrSampleRange, lo, hi, w.n)
	}
	if k := hi - lo; tree && (k&(k-1) != 0 || lo%k != 0) && !(lo == 0 && hi == w.n) {
		return fmt.Errorf("%w: [%d, %d) is not an aligned power-of-two range (a node of the pairwise sample tree)",
			ErrSampleRange, lo, hi)
	}
	return nil
}

func (w *work[F]) forward(r int, params []F, lo, hi int) error {
	reg, err := w.checkRegion(r)
	if err != nil {
		return err
	}
	if err := w.checkRange(lo, hi, false); err != nil {
		return err
	}
	if len(params) < reg.Size {
		return fmt.Errorf("%w: %s parameters have %d elements, want %d", ErrBufferSize, reg.Name, len(params), reg.Size)
	}
	if !w.batchSet {
		return fmt.Errorf("%w: forward %s before SetBatch", ErrOrder, reg.Name)
	}
	for s := lo; s < hi; s++ {
		if r > 0 && !w.fwd[r-1][s] {
			return fmt.Errorf("%w: forward %s for sample %d before forward %s", ErrOrder, reg.Name, s, w.lay.Regions[r-1].Name)
		}
	}
	pieces := w.split(lo, hi)
	parallel(len(pieces), func(i int) {
		ln := w.lanes[i]
		for s := pieces[i][0]; s < pieces[i][1]; s++ {
			switch {
			case r == 0:
				w.embedFwd(reg, params, s)
			case r <= w.cfg.Layers:
				w.blockFwd(ln, reg, r-1, params, s)
			default:
				w.headFwd(ln, reg, params, s)
			}
		}
	})
	for s := lo; s < hi; s++ {
		w.fwd[r][s] = true
		w.bwd[r][s] = false
	}
	return nil
}

func (w *work[F]) backward(r int, params, grad []F, lo, hi int) error {
	reg, err := w.checkRegion(r)
	if err != nil {
		return err
	}
	if err := w.checkRange(lo, hi, true); err != nil {
		return err
	}
	if len(params) < reg.Size || len(grad) < reg.Size {
		return fmt.Errorf("%w: %s parameters have %d and gradient %d elements, want at least %d",
			ErrBufferSize, reg.Name, len(params), len(grad), reg.Size)
	}
	last := len(w.lay.Regions) - 1
	for s := lo; s < hi; s++ {
		switch {
		case !w.fwd[last][s]:
			return fmt.Errorf("%w: backward %s for sample %d before forward reached the head", ErrOrder, reg.Name, s)
		case w.bwd[r][s]:
			return fmt.Errorf("%w: backward %s for sample %d ran twice; its input gradient is consumed", ErrOrder, reg.Name, s)
		case r < last && !w.bwd[r+1][s]:
			return fmt.Errorf("%w: backward %s for sample %d before backward %s", ErrOrder, reg.Name, s, w.lay.Regions[r+1].Name)
		}
	}
	// Padding past the region (shard rounding) gets zero gradient, so a
	// reduce-scatter of the padded buffer and the optimizer keep it at zero.
	zero(grad[reg.Size:])
	dst := grad[:reg.Size]
	// With k lanes, cut [lo, hi) into the largest power of two ≤ k equal
	// pieces: each is a node of the pairwise tree, so summing the pieces'
	// sums with the tree gives the bits of the single-threaded recursion.
	// A whole workspace whose size is not a power of two runs on one lane:
	// its tree's top split is not into equal halves.
	k := 1
	if n := hi - lo; n&(n-1) == 0 {
		for k*2 <= len(w.lanes) && k*2 <= n {
			k *= 2
		}
	}
	size := (hi - lo) / k
	parallel(k, func(i int) {
		ln := w.lanes[i]
		out := dst
		if i > 0 {
			if cap(ln.part) < len(dst) {
				ln.part = make([]F, len(dst))
			}
			out = ln.part[:len(dst)]
		}
		w.treeBwd(ln, reg, params, out, lo+i*size, lo+(i+1)*size, 0)
	})
	if k > 1 {
		parts := make([][]F, k)
		parts[0] = dst
		for i := 1; i < k; i++ {
			parts[i] = w.lanes[i].part[:len(dst)]
		}
		treeCombine(dst, parts)
	}
	for s := lo; s < hi; s++ {
		w.bwd[r][s] = true
	}
	return nil
}

// treeCombine sums parts (a power-of-two count, parts[0] aliasing dst) by the
// pairwise tree, in place: at stride 1, 2, 4 … part i absorbs part i+stride.
// For power-of-two counts this is the same tree as treeSum.
func treeCombine[F float](dst []F, parts [][]F) {
	for stride := 1; stride < len(parts); stride *= 2 {
		for i := 0; i+stride < len(parts); i += 2 * stride {
			add(parts[i], parts[i+stride])
		}
	}
}

// treeBwd writes into dst the sum over samples [lo, hi) of the per-sample
// gradients, added by the pairwise tree: the left half's sum plus the right
// half's sum, recursively (for a length that is not a power of two the left
// part is the largest power of two below it, as in TreeSum). Samples are
// visited in index order.
func (w *work[F]) treeBwd(ln *lane[F], reg *Region, params, dst []F, lo, hi, depth int) {
	if hi-lo == 1 {
		zero(dst)
		w.sampleBwd(ln, reg, params, dst, lo)
		return
	}
	mid := lo + highBit(hi-lo-1)
	w.treeBwd(ln, reg, params, dst, lo, mid, depth+1)
	for len(ln.tree) <= depth {
		ln.tree = append(ln.tree, nil)
	}
	if cap(ln.tree[depth]) < len(dst) {
		ln.tree[depth] = make([]F, len(dst))
	}
	right := ln.tree[depth][:len(dst)]
	w.treeBwd(ln, reg, params, right, mid, hi, depth+1)
	add(dst, right)
}

func (w *work[F]) sampleBwd(ln *lane[F], reg *Region, params, g []F, s int) {
	switch {
	case reg.Index == 0:
		w.embedBwd(reg, g, s)
	case reg.Index <= w.cfg.Layers:
		w.blockBwd(ln, reg, reg.Index-1, params, g, s)
	default:
		w.headBwd(ln, reg, params, g, s)
	}
}

// lossSum is the pairwise-tree sum of the per-sample losses of [lo, hi).
func (w *work[F]) lossSum(lo, hi int) (F, error) {
	if err := w.checkRange(lo, hi, true); err != nil {
		return 0, err
	}
	last := len(w.lay.Regions) - 1
	for s := lo; s < hi; s++ {
		if !w.fwd[last][s] {
			return 0, fmt.Errorf("%w: loss of sample %d before forward reached the head", ErrOrder, s)
		}
	}
	return treeScalar(w.loss[lo:hi]), nil
}

// treeScalar sums v by the pairwise tree (the left part is the largest power
// of two below len(v), which halves power-of-two lengths).
func treeScalar[F float](v []F) F {
	if len(v) == 1 {
		return v[0]
	}
	mid := highBit(len(v) - 1)
	return treeScalar(v[:mid]) + treeScalar(v[mid:])
}

// highBit is the largest power of two ≤ x (x ≥ 1).
func highBit(x int) int {
	p := 1
	for p*2 <= x {
		p *= 2
	}
	return p
}

func (w *work[F]) embedFwd(reg *Region, params []F, s int) {
	T, D := w.cfg.SeqLen, w.cfg.Dim
	tok, pos := view(reg, params, tTok), view(reg, params, tPos)
	x := per(w.resid[0], s, w.n)
	in := w.inputs[s*T : (s+1)*T]
	for t := 0; t < T; t++ {
		e := tok[int(in[t])*D : int(in[t]+1)*D]
		p := pos[t*D : (t+1)*D]
		xt := x[t*D : (t+1)*D]
		for i := range xt {
			xt[i] = e[i] + p[i]
		}
	}
}

func (w *work[F]) embedBwd(reg *Region, g []F, s int) {
	T, D := w.cfg.SeqLen, w.cfg.Dim
	dtok, dpos := view(reg, g, tTok), view(reg, g, tPos)
	dx := per(w.dx, s, w.n)
	in := w.inputs[s*T : (s+1)*T]
	for t := 0; t < T; t++ {
		dxt := dx[t*D : (t+1)*D]
		add(dtok[int(in[t])*D:int(in[t]+1)*D], dxt)
		add(dpos[t*D:(t+1)*D], dxt)
	}
}

func (w *work[F]) blockFwd(ln *lane[F], reg *Region, l int, params []F, s int) {
	T, D, H, Hd := w.cfg.SeqLen, w.cfg.Dim, w.cfg.Heads, w.cfg.Hidden
	c, n := &w.blk[l], w.n
	x, y := per(w.resid[l], s, n), per(w.resid[l+1], s, n)
	xhat1, rstd1, h1 := per(c.xhat1, s, n), per(c.rstd1, s, n), per(c.h1, s, n)
	qkv, att, o := per(c.qkv, s, n), per(c.att, s, n), per(c.o, s, n)
	xhat2, rstd2, h2 := per(c.xhat2, s, n), per(c.rstd2, s, n), per(c.h2, s, n)
	u, f := per(c.u, s, n), per(c.f, s, n)
	x2 := ln.sc.x2
	p := func(t int) []F { return view(reg, params, t) }

	layerNormFwd(h1, xhat1, rstd1, x, p(tLN1W), p(tLN1B), T, D, F(w.cfg.LNEps))
	linearFwd(qkv, h1, p(tQKVW), p(tQKVB), T, D, 3*D)
	attentionFwd(o, att, qkv, T, D, H)
	linearFwd(x2, o, p(tProjW), p(tProjB), T, D, D)
	add(x2, x) // x2 = x + attn(x)
	layerNormFwd(h2, xhat2, rstd2, x2, p(tLN2W), p(tLN2B), T, D, F(w.cfg.LNEps))
	linearFwd(u, h2, p(tFC1W), p(tFC1B), T, D, Hd)
	actFwd(w.cfg.Activation, f, u)
	linearFwd(y, f, p(tFC2W), p(tFC2B), T, Hd, D)
	add(y, x2) // y = x2 + mlp(x2)
}

func (w *work[F]) blockBwd(ln *lane[F], reg *Region, l int, params, g []F, s int) {
	T, D, H, Hd := w.cfg.SeqLen, w.cfg.Dim, w.cfg.Heads, w.cfg.Hidden
	c, n := &w.blk[l], w.n
	xhat1, rstd1, h1 := per(c.xhat1, s, n), per(c.rstd1, s, n), per(c.h1, s, n)
	qkv, att, o := per(c.qkv, s, n), per(c.att, s, n), per(c.o, s, n)
	xhat2, rstd2, h2 := per(c.xhat2, s, n), per(c.rstd2, s, n), per(c.h2, s, n)
	u, f := per(c.u, s, n), per(c.f, s, n)
	dy := per(w.dx, s, n) // in: dL/dy; out: dL/dx
	sc := &ln.sc
	p := func(t int) []F { return view(reg, params, t) }
	gr := func(t int) []F { return view(reg, g, t) }

	// MLP branch: y = x2 + fc2(act(fc1(ln2(x2)))).
	linearBwd(sc.dhid, gr(tFC2W), gr(tFC2B), dy, f, p(tFC2W), T, Hd, D)
	actBwd(w.cfg.Activation, sc.dhid, u)
	linearBwd(sc.dh, gr(tFC1W), gr(tFC1B), sc.dhid, h2, p(tFC1W), T, D, Hd)
	copy(sc.dx2, dy)
	layerNormBwd(sc.dx2, gr(tLN2W), gr(tLN2B), sc.dh, xhat2, rstd2, p(tLN2W), sc.lnTmp, T, D)

	// Attention branch: x2 = x + proj(attn(qkv(ln1(x)))).
	linearBwd(sc.do_, gr(tProjW), gr(tProjB), sc.dx2, o, p(tProjW), T, D, D)
	attentionBwd(sc.dqkv, sc.do_, att, qkv, sc.dp, T, D, H)
	linearBwd(sc.dh, gr(tQKVW), gr(tQKVB), sc.dqkv, h1, p(tQKVW), T, D, 3*D)
	copy(dy, sc.dx2)
	layerNormBwd(dy, gr(tLN1W), gr(tLN1B), sc.dh, xhat1, rstd1, p(tLN1W), sc.lnTmp, T, D)
}

func (w *work[F]) headFwd(ln *lane[F], reg *Region, params []F, s int) {
	T, D, V, n := w.cfg.SeqLen, w.cfg.Dim, w.cfg.Vocab, w.n
	c := &w.head
	x := per(w.resid[w.cfg.Layers], s, n)
	h := per(c.h, s, n)
	layerNormFwd(h, per(c.xhat, s, n), per(c.rstd, s, n), x, view(reg, params, tLNFW), view(reg, params, tLNFB), T, D, F(w.cfg.LNEps))
	linearFwd(ln.sc.logits, h, view(reg, params, tOutW), view(reg, params, tOutB), T, D, V)
	w.loss[s] = crossEntropy(per(c.prob, s, n), ln.sc.logits, w.targets[s*T:(s+1)*T], T, V)
}

func (w *work[F]) headBwd(ln *lane[F], reg *Region, params, g []F, s int) {
	T, D, V, n := w.cfg.SeqLen, w.cfg.Dim, w.cfg.Vocab, w.n
	c := &w.head
	// d(mean over positions of CE)/dlogits = (softmax − onehot)/T.
	dl := ln.sc.logits
	copy(dl, per(c.prob, s, n))
	tg := w.targets[s*T : (s+1)*T]
	invT := 1 / F(T)
	for t := 0; t < T; t++ {
		dl[t*V+int(tg[t])] -= 1
		for i := t * V; i < (t+1)*V; i++ {
			dl[i] = F(dl[i] * invT)
		}
	}
	linearBwd(ln.sc.dh, view(reg, g, tOutW), view(reg, g, tOutB), dl, per(c.h, s, n), view(reg, params, tOutW), T, D, V)
	dx := per(w.dx, s, n)
	zero(dx)
	layerNormBwd(dx, view(reg, g, tLNFW), view(reg, g, tLNFB), ln.sc.dh, per(c.xhat, s, n), per(c.rstd, s, n), view(reg, params, tLNFW), ln.sc.lnTmp, T, D)
}
