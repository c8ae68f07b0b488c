// Family: one row.
#pragma once

#include "../common/row_end.cuh"

namespace {

// A lone row (logits of shape (C,), or N = 1) of up to 128 KB (sm_75: 64) is latency, not bandwidth: one CTA
// holds all of it in registers, one batch per thread, so the row costs one round trip, a few
// hundred instructions and one barrier; the target's load and the row's go out together and
// nothing stands before them, and the mean of one row is its loss, so there is no sum to keep
// ("One row"). blockDim.x threads (whole warps, a power of two: the plan's group) take the row's
// whole vectors threadIdx.x + u * blockDim.x, and the few elements outside them one each.
template <class E>
__global__ void __launch_bounds__(kOneRowCta) cross_entropy_one_row_kernel(const Params p) {
  __shared__ float2 warp_state[kOneRowThreads / 32];
  __shared__ float x_target;
  const TargetWords target = load_target_words(p, 0);
  const auto* row = static_cast<const typename E::Storage*>(p.logits);
  const int cols = int(p.cols);
  const Aligned cut = align_stretch<E>(row, cols);
  const uint4* body = reinterpret_cast<const uint4*>(row + cut.head);
  const uint4 neg_inf = neg_inf_vec<E>();
  uint4 vec[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    vec[u] = i < cut.nvec ? body[i] : neg_inf;  // -inf adds exp(-inf) = 0
  }
  const int nedge = cols - cut.nvec * E::kPerVec;  // at most 2 * (kPerVec - 1): fewer than 32
  const float edge = int(threadIdx.x) < nedge ? load_scalar<E>(row + edge_element<E>(cut, threadIdx.x)) : -INFINITY;

  const float m = lanes_max(fmaxf(vectors_max<E>(vec), edge), 32);
  const float base = safe_base(m);
  const float s = warp_sum(vectors_sum_exp<E>(vec, base, exp2_approx((edge - base) * kLog2e)));
  if ((threadIdx.x & 31) == 0) warp_state[threadIdx.x >> 5] = make_float2(m, s);

  // The thread that holds the target logit leaves it in shared memory.
  const int code = target_code(p, target_value(p, target));
  const float weight = threadIdx.x == 0 ? class_weight<E>(p, code) : 1.f;
  const int c = code - cut.head;  // the target's place in the whole vectors
  if (code >= 0 && c >= 0 && c < cut.nvec * E::kPerVec) {
    const int shift = __ffs(blockDim.x) - 1, v = c / E::kPerVec;
    if ((v & (blockDim.x - 1)) == threadIdx.x) x_target = E::at(vector_at(vec, uint32_t(v >> shift)), c % E::kPerVec);
  } else if (code >= 0 && int(threadIdx.x) == edge_number<E>(cut, code)) {
    x_target = edge;
  }
  __syncthreads();

  if (threadIdx.x < 32) {
    const int w = threadIdx.x;
    const float2 part = w < int(blockDim.x >> 5) ? warp_state[w] : make_float2(-INFINITY, 0.f);
    Lse st = {part.x, part.y};
    lse_reduce_lanes(st, kOneRowThreads / 32);
    // The mean of one row: an ignored target leaves none to average (0 / 0), a bad one is NaN; both
    // NaN, as in PyTorch.
    if (w == 0) {
      const float loss = row_outcome<E>(p, 0, code, st, x_target, weight);
      if (!kOptions) {
        E::store(p.out, loss);  // row_outcome's NaN for an ignored target: the mean's 0 / 0
      } else if (p.reduction != kReductionNone) {
        const bool ignored = code == kTargetIgnored;
        const float sum = ignored ? 0.f : loss;
        store_out<E>(p, p.reduction == kReductionMean ? sum / (ignored ? 0.f : weight) : sum);
      }
    }
  }
}

}  // namespace
