package model

import "math"

// float is the element type of the kernels. The package computes in float32;
// the float64 instantiation exists so the gradient check can compare the
// hand-written backward against finite differences without float32 noise.
type float interface{ ~float32 | ~float64 }

// The kernels below work on one sample at a time (T rows). Every sum has a
// fixed order that depends only on the sizes, never on the batch split, and
// every product is rounded by an explicit conversion before it is added:
// the Go spec allows x*y+z to be fused into an FMA unless the product is
// converted, and a fused and an unfused rank must not differ.

// dot returns Σ a[i]·b[i] with four interleaved partial sums (for
// instruction-level parallelism) combined as (s0+s1)+(s2+s3).
func dot[F float](a, b []F) F {
	b = b[:len(a)]
	var s0, s1, s2, s3 F
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += F(a[i] * b[i])
		s1 += F(a[i+1] * b[i+1])
		s2 += F(a[i+2] * b[i+2])
		s3 += F(a[i+3] * b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += F(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy does y += a·x.
func axpy[F float](y []F, a F, x []F) {
	x = x[:len(y)]
	for i := range y {
		y[i] += F(a * x[i])
	}
}

// add does y += x.
func add[F float](y, x []F) {
	x = x[:len(y)]
	for i := range y {
		y[i] += x[i]
	}
}

func zero[F float](x []F) {
	clear(x)
}

// linearFwd computes y[t] = W·x[t] + b for T rows; W is [out, in].
//
// Each output is a sequential dot product (i = 0, 1, …) plus the bias. Four
// outputs are computed together so x[t] is loaded once per four rows of W and
// the four independent sums keep the FPU busy; the blocking changes which
// sums run side by side, not the order inside any one sum.
func linearFwd[F float](y, x, w, b []F, T, in, out int) {
	for t := 0; t < T; t++ {
		xt := x[t*in : (t+1)*in : (t+1)*in]
		yt := y[t*out : (t+1)*out]
		j := 0
		for ; j+4 <= out; j += 4 {
			w0 := w[j*in : (j+1)*in]
			w1 := w[(j+1)*in : (j+2)*in]
			w2 := w[(j+2)*in : (j+3)*in]
			w3 := w[(j+3)*in : (j+4)*in]
			w0, w1, w2, w3 = w0[:len(xt)], w1[:len(xt)], w2[:len(xt)], w3[:len(xt)]
			var s0, s1, s2, s3 F
			for i, xv := range xt {
				s0 += F(w0[i] * xv)
				s1 += F(w1[i] * xv)
				s2 += F(w2[i] * xv)
				s3 += F(w3[i] * xv)
			}
			yt[j], yt[j+1], yt[j+2], yt[j+3] = s0+b[j], s1+b[j+1], s2+b[j+2], s3+b[j+3]
		}
		for ; j < out; j++ {
			wj := w[j*in : (j+1)*in]
			wj = wj[:len(xt)]
			var s0 F
			for i, xv := range xt {
				s0 += F(wj[i] * xv)
			}
			yt[j] = s0 + b[j]
		}
	}
}

// axpy4 does y += a0·x0, then a1·x1, a2·x2, a3·x3, element by element in
// that order: the same bits as four axpy calls, with y loaded and stored once.
func axpy4[F float](y []F, a0, a1, a2, a3 F, x0, x1, x2, x3 []F) {
	x0, x1, x2, x3 = x0[:len(y)], x1[:len(y)], x2[:len(y)], x3[:len(y)]
	for i, v := range y {
		v += F(a0 * x0[i])
		v += F(a1 * x1[i])
		v += F(a2 * x2[i])
		v += F(a3 * x3[i])
		y[i] = v
	}
}

// linearBwd accumulates dW += Σ_t dy[t]⊗x[t] and db += Σ_t dy[t] (t in
// order), and, when dx is not nil, overwrites dx[t] = Wᵀ·dy[t] (j in order).
func linearBwd[F float](dx, dw, db, dy, x, w []F, T, in, out int) {
	for j := 0; j < out; j++ {
		dwj := dw[j*in : (j+1)*in]
		t := 0
		for ; t+4 <= T; t += 4 {
			g0, g1, g2, g3 := dy[t*out+j], dy[(t+1)*out+j], dy[(t+2)*out+j], dy[(t+3)*out+j]
			db[j] += g0
			db[j] += g1
			db[j] += g2
			db[j] += g3
			// All four zero (ReLU's dead units): adding ±0 to the
			// accumulator, which is never −0, would change no bits.
			if g0 == 0 && g1 == 0 && g2 == 0 && g3 == 0 {
				continue
			}
			axpy4(dwj, g0, g1, g2, g3, x[t*in:(t+1)*in], x[(t+1)*in:(t+2)*in], x[(t+2)*in:(t+3)*in], x[(t+3)*in:(t+4)*in])
		}
		for ; t < T; t++ {
			g := dy[t*out+j]
			db[j] += g
			axpy(dwj, g, x[t*in:(t+1)*in])
		}
	}
	if dx == nil {
		return
	}
	for t := 0; t < T; t++ {
		dxt := dx[t*in : (t+1)*in]
		zero(dxt)
		dyt := dy[t*out : (t+1)*out]
		j := 0
		for ; j+4 <= out; j += 4 {
			axpy4(dxt, dyt[j], dyt[j+1], dyt[j+2], dyt[j+3],
				w[j*in:(j+1)*in], w[(j+1)*in:(j+2)*in], w[(j+2)*in:(j+3)*in], w[(j+3)*in:(j+4)*in])
		}
		for ; j < out; j++ {
			axpy(dxt, dyt[j], w[j*in:(j+1)*in])
		}
	}
}

// layerNormFwd normalises each of T rows of x over D: xhat = (x-mean)·rstd,
// y = xhat·g + b. It keeps xhat and rstd for the backward pass.
func layerNormFwd[F float](y, xhat, rstd, x, g, b []F, T, D int, eps F) {
	invD := 1 / F(D)
	for t := 0; t < T; t++ {
		xt := x[t*D : (t+1)*D]
		var mean F
		for _, v := range xt {
			mean += v
		}
		mean = F(mean * invD)
		var variance F
		for _, v := range xt {
			d := v - mean
			variance += F(d * d)
		}
		variance = F(variance * invD)
		r := F(1 / math.Sqrt(float64(variance+eps)))
		rstd[t] = r
		ht := xhat[t*D : (t+1)*D]
		yt := y[t*D : (t+1)*D]
		for i, v := range xt {
			h := F((v - mean) * r)
			ht[i] = h
			yt[i] = F(h*g[i]) + b[i]
		}
	}
}

// layerNormBwd accumulates dg, db and ADDS the input gradient into dx (the
// callers are residual branches, whose input gradient is a sum):
// dx += rstd·(dxhat − mean(dxhat) − xhat·mean(dxhat·xhat)), dxhat = dy·g.
// tmp must hold D elements.
func layerNormBwd[F float](dx, dg, db, dy, xhat, rstd, g, tmp []F, T, D int) {
	invD := 1 / F(D)
	tmp = tmp[:D]
	for t := 0; t < T; t++ {
		dyt := dy[t*D : (t+1)*D]
		ht := xhat[t*D : (t+1)*D]
		var m1, m2 F
		for i, d := range dyt {
			dg[i] += F(d * ht[i])
			db[i] += d
			dh := F(d * g[i])
			tmp[i] = dh
			m1 += dh
			m2 += F(dh * ht[i])
		}
		m1 = F(m1 * invD)
		m2 = F(m2 * invD)
		r := rstd[t]
		dxt := dx[t*D : (t+1)*D]
		for i, dh := range tmp {
			dxt[i] += F(r * (dh - m1 - F(ht[i]*m2)))
		}
	}
}

const (
	geluC = 0.7978845608028654 // sqrt(2/π)
	geluA = 0.044715
)

// actFwd applies the nonlinearity elementwise. GELU is computed in float64
// and rounded once, which is deterministic and accurate; its products are
// converted explicitly, like everywhere else, so no platform fuses them.
func actFwd[F float](act Activation, y, u []F) {
	if act == ReLU {
		for i, v := range u {
			y[i] = max(v, 0)
		}
		return
	}
	for i, v := range u {
		x := float64(v)
		y[i] = F(0.5 * x * (1 + math.Tanh(geluC*(x+float64(geluA*x*x*x)))))
	}
}

// actBwd overwrites d[i] with d[i]·act'(u[i]).
func actBwd[F float](act Activation, d, u []F) {
	if act == ReLU {
		for i, v := range u {
			if !(v > 0) {
				d[i] = 0
			}
		}
		return
	}
	for i, v := range u {
		x := float64(v)
		th := math.Tanh(geluC * (x + float64(geluA*x*x*x)))
		dydx := float64(0.5*(1+th)) + float64(0.5*x*(1-float64(th*th))*geluC*(1+float64(3*geluA*x*x)))
		d[i] = F(float64(d[i]) * dydx)
	}
}

// attentionFwd computes causal multi-head attention for one sample.
// qkv is [T, 3D] (q, k, v side by side, each split into H heads of hd);
// p receives the attention probabilities [H, T, T] (zero above the
// diagonal); o receives the concatenated head outputs [T, D].
func attentionFwd[F float](o, p, qkv []F, T, D, H int) {
	hd := D / H
	scale := F(1 / math.Sqrt(float64(hd)))
	zero(o)
	for h := 0; h < H; h++ {
		for t := 0; t < T; t++ {
			q := qkv[t*3*D+h*hd : t*3*D+(h+1)*hd]
			pt := p[(h*T+t)*T : (h*T+t+1)*T]
			mx := F(math.Inf(-1))
			for u := 0; u <= t; u++ {
				s := F(dot(q, qkv[u*3*D+D+h*hd:u*3*D+D+(h+1)*hd]) * scale)
				pt[u] = s
				mx = max(mx, s)
			}
			var sum F
			for u := 0; u <= t; u++ {
				e := F(math.Exp(float64(pt[u] - mx)))
				pt[u] = e
				sum += e
			}
			inv := 1 / sum
			ot := o[t*D+h*hd : t*D+(h+1)*hd]
			for u := 0; u <= t; u++ {
				pt[u] = F(pt[u] * inv)
				axpy(ot, pt[u], qkv[u*3*D+2*D+h*hd:u*3*D+2*D+(h+1)*hd])
			}
			zero(pt[t+1:])
		}
	}
}

// attentionBwd overwrites dqkv [T, 3D] with the gradient of the attention
// input given do [T, D], the saved probabilities p and the saved qkv.
// dp must hold T elements.
func attentionBwd[F float](dqkv, do, p, qkv, dp []F, T, D, H int) {
	hd := D / H
	scale := F(1 / math.Sqrt(float64(hd)))
	zero(dqkv)
	for h := 0; h < H; h++ {
		for t := 0; t < T; t++ {
			dot_ := do[t*D+h*hd : t*D+(h+1)*hd]
			pt := p[(h*T+t)*T : (h*T+t+1)*T]
			// dP[u] = do·v_u; dV_u += P[u]·do.
			var s F
			for u := 0; u <= t; u++ {
				v := qkv[u*3*D+2*D+h*hd : u*3*D+2*D+(h+1)*hd]
				dp[u] = dot(dot_, v)
				s += F(pt[u] * dp[u])
				axpy(dqkv[u*3*D+2*D+h*hd:u*3*D+2*D+(h+1)*hd], pt[u], dot_)
			}
			// Softmax backward: dS[u] = P[u]·(dP[u] − Σ P·dP); then the
			// scores s = scale·q·k give dq and dk.
			q := qkv[t*3*D+h*hd : t*3*D+(h+1)*hd]
			dq := dqkv[t*3*D+h*hd : t*3*D+(h+1)*hd]
			for u := 0; u <= t; u++ {
				ds := F(F(pt[u]*(dp[u]-s)) * scale)
				if ds == 0 {
					continue
				}
				axpy(dq, ds, qkv[u*3*D+D+h*hd:u*3*D+D+(h+1)*hd])
				axpy(dqkv[u*3*D+D+h*hd:u*3*D+D+(h+1)*hd], ds, q)
			}
		}
	}
}

// crossEntropy computes, for one sample, softmax probabilities of logits
// [T, V] into prob and returns the mean over the T positions of
// −log p(target). The sum over positions runs in float64 (it is a short,
// fixed-order sum) and is rounded once.
func crossEntropy[F float](prob, logits []F, targets []int32, T, V int) F {
	var total float64
	for t := 0; t < T; t++ {
		z := logits[t*V : (t+1)*V]
		pr := prob[t*V : (t+1)*V]
		mx := z[0]
		for _, v := range z[1:] {
			mx = max(mx, v)
		}
		var sum float64
		for _, v := range z {
			sum += math.Exp(float64(v - mx))
		}
		// Recomputing exp (V per position) is cheaper than keeping a float64
		// copy, and rounds each probability only once.
		inv := 1 / sum
		for i, v := range z {
			pr[i] = F(math.Exp(float64(v-mx)) * inv)
		}
		total += math.Log(sum) - float64(z[targets[t]]-mx)
	}
	return F(total / float64(T))
}
