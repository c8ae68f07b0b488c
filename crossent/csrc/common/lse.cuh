// The (max, sum of exp) of a row: the exponentials and the merge.
#pragma once

#include "formats.cuh"

namespace {

// (m, s): the largest value seen and the sum of exp(x - m) over the values seen.
struct Lse {
  float m, s;
};

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The exponent's base: 0 while every value seen is -inf, so that those values contribute
// exp(-inf) = 0 instead of exp(-inf + inf) = NaN. NaN logits still reach the sum (fmaxf skips
// them, exp does not), and +inf gives NaN through inf - inf, both as in PyTorch.
__device__ __forceinline__ float safe_base(float m) { return m == -INFINITY ? 0.f : m; }

__device__ __forceinline__ Lse lse_merge(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  const float base = safe_base(m);
  return {m, a.s * exp2_approx((a.m - base) * kLog2e) + b.s * exp2_approx((b.m - base) * kLog2e)};
}

// Sum of exp(x - base) over a lane's values, each as exp2 of one FMA: x * log2(e) - c, with
// c = base * log2(e) rounded. The rounding error of that product, d = c - base * log2(e), is exact
// (an FMA gives it) and shifts every exponent alike, so the sum comes out scaled by exactly 2^-d and
// is corrected once: each exponent is rounded once and costs one instruction instead of two. A base
// this large or larger (or not finite) takes the two-instruction form: there d would be as large as
// the exponents themselves. sum_exp2(exponent) must return the lane's sum of exp2(exponent(x)).
constexpr float kFoldLimit = 0x1p20f;

template <class SumExp2>
__device__ __forceinline__ float sum_exp(float base, SumExp2 sum_exp2) {
  if (fabsf(base) < kFoldLimit) {
    const float c = base * kLog2e;
    return sum_exp2([c](float x) { return fmaf(x, kLog2e, -c); }) * exp2_approx(-fmaf(base, kLog2e, -c));
  }
  return sum_exp2([base](float x) { return (x - base) * kLog2e; });
}

// The largest element of n vectors. It runs on the stored words (packed pairs for 16-bit formats),
// so no unpacked copy of the vectors stays live until their exps.
template <class E, int N>
__device__ __forceinline__ float vectors_max(const uint4 (&v)[N]) {
  if constexpr (!E::kPackedMax) {  // one float, word by word: the packed tree spilled where max2 is emulated
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < N; ++u)
#pragma unroll
      for (int i = 0; i < 4; ++i) m = fmaxf(m, E::word_max(word(v[u], i)));
    return m;
  }
  uint4 mx = v[0];
#pragma unroll
  for (int u = 1; u < N; ++u) {
    mx.x = E::max2(mx.x, v[u].x);
    mx.y = E::max2(mx.y, v[u].y);
    mx.z = E::max2(mx.z, v[u].z);
    mx.w = E::max2(mx.w, v[u].w);
  }
  return E::word_max(E::max2(E::max2(mx.x, mx.y), E::max2(mx.z, mx.w)));
}

// s plus the sum of exp(x - base) over the elements of the first nvalid of n vectors, in two chains.
// The exponent stays (x - base) * log2(e): sum_exp's folded form is no faster on rows streamed
// through registers, whose pace the loads set, and needs a branch (docs/design, "Loads").
template <class E, int N>
__device__ __forceinline__ float vectors_sum_exp(const uint4 (&v)[N], float base, float s, int nvalid = N) {
  float s1 = 0.f;
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (u < nvalid)  // the vectors past nvalid hold -inf: exp adds 0, so a partial batch skips them
#pragma unroll
      for (int i = 0; i < E::kPerVec; i += 2) {
        s += exp2_approx((E::at(v[u], i) - base) * kLog2e);
        s1 += exp2_approx((E::at(v[u], i + 1) - base) * kLog2e);
      }
  return s + s1;
}

// One batch of vectors: one rescale of the running sum, then one exp per element.
template <class E>
__device__ __forceinline__ Lse lse_add_batch(Lse st, const uint4 (&buf)[kBatch], int nvalid = kBatch) {
  const float m = fmaxf(st.m, vectors_max<E>(buf));
  const float base = safe_base(m);
  return {m, vectors_sum_exp<E>(buf, base, st.s * exp2_approx((st.m - base) * kLog2e), nvalid)};
}

// log_softmax(x)[t] = x_t - m - log(s); all -inf rows give NaN (-inf - -inf), as in PyTorch.
__device__ __forceinline__ float row_loss(Lse st, float x_target) {
  return logf(st.s) - (x_target - st.m);
}

}  // namespace
