// Reductions across threads: lanes, warps and the CTA, in a fixed order.
#pragma once

#include "lse.cuh"

namespace {

// Butterflies over `width` lanes (a power of two <= 32): every lane ends with the result. Max and
// sum are both commutative bit for bit, so all lanes agree and the result never depends on timing.
__device__ __forceinline__ float lanes_max(float v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
template <class T>
__device__ __forceinline__ T lanes_sum(T v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_sum(T v) { return lanes_sum(v, 32); }

// The merged (m, s) of `width` lanes, in every lane. The max goes first, then each lane rescales its
// sum to it once and the sums go: one exp per lane, where merging (m, s) pairs round by round costs
// two exps a round.
__device__ __forceinline__ void lse_reduce_lanes(Lse& st, int width) {
  const float m = lanes_max(st.m, width);
  const float s = st.s * exp2_approx((st.m - safe_base(m)) * kLog2e);  // +inf max: inf - inf = NaN, as in PyTorch
  st = {m, lanes_sum(s, width)};
}

// Label smoothing adds (eps / C) * sum_j w_j (lse - x_j) to a row's loss (w_j: the class weights, 1
// without). With lse = base + log(s), that is W log(s) + sum_j w_j (base - x_j): a Gap holds the
// second sum and W = sum_j w_j over the values seen, against the state's base (safe_base of its
// max), so that no large logit cancels another: a plain sum of the x_j loses the loss to rounding
// once the logits share a large offset. rebase moves it to a new base; every weight 0: nothing seen.
struct Gap {
  float sum, weight;
};
__device__ __forceinline__ Gap gap_rebase(Gap g, float from, float to) {
  return {g.weight == 0.f ? g.sum : fmaf(g.weight, to - from, g.sum), g.weight};
}
__device__ __forceinline__ Gap gap_lanes_sum(Gap g, int width) { return {lanes_sum(g.sum, width), lanes_sum(g.weight, width)}; }

// A loss sum and the mean's divisor (the rows counted, or their classes' weights). Summed together,
// so the final reduction costs one round of the CTA.
struct Total {
  double sum, divisor;
};

// Fixed-order sum over the CTA; the total is valid in thread 0. Every thread must call it.
__device__ Total cta_sum(Total v, Total* scratch) {
  v.sum = warp_sum(v.sum);
  v.divisor = warp_sum(v.divisor);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  Total total = {0.0, 0.0};
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total = {total.sum + scratch[w].sum, total.divisor + scratch[w].divisor};
  __syncthreads();
  return total;
}

__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace
