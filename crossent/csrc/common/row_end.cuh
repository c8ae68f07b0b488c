// The end of a row, a chunk and a launch: a row's loss with its options, the chunk's sums, the last CTA's result.
#pragma once

#include "claims.cuh"
#include "exact_sum.cuh"
#include "memory.cuh"
#include "reduce.cuh"
#include "targets.cuh"

namespace {

// Whether the mean divides by the counted rows' class weights (the options build, given weights)
// rather than by the rows counted.
__device__ __forceinline__ bool weighted(const Params& p) { return kOptions && p.weight != nullptr; }

// Whether rows add label smoothing's term (the options build, eps > 0): a Gap per row.
__device__ __forceinline__ bool smoothing(const Params& p) { return kOptions && p.label_smoothing != 0.f; }

// A chunk's sums in shared memory, a slot per warp: the losses', and where weighted the weights'.
constexpr int kChunkSums = kOptions ? 2 * kWarps : kWarps;

// The end of a chunk of whole rows: each warp sums its group leaders' losses (and weights, where
// weighted) at once, thread 0 publishes its claim, and after the chunk's one barrier thread 0 sums
// the warps in order and adds that to the exact sum (thread 32 the weights', to their own). Segments
// (whole_rows false) leave a partial per item instead, and only publish and wait. warp_sums (of
// kChunkSums) and claimed are this step's slots. Every thread must call it.
__device__ __forceinline__ void end_chunk(const Params& p, bool whole_rows, float loss_sum, float weight_sum, int group,
                                          float* warp_sums, const ChunkClaims& claims, unsigned int claim,
                                          long long* claimed) {
  if (whole_rows) {
    for (int offset = group; offset < 32; offset <<= 1) {
      loss_sum += __shfl_xor_sync(0xffffffffu, loss_sum, offset);
      if (weighted(p)) weight_sum += __shfl_xor_sync(0xffffffffu, weight_sum, offset);
    }
    if ((threadIdx.x & 31) == 0) {
      warp_sums[threadIdx.x >> 5] = loss_sum;
      if (weighted(p)) warp_sums[kWarps + (threadIdx.x >> 5)] = weight_sum;
    }
  }
  claims.publish(claimed, claim);
  __syncthreads();
  if (whole_rows && threadIdx.x == 0) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[w];
    exact_add(p.exact, sum);
  }
  if (whole_rows && threadIdx.x == 32 && weighted(p)) {  // the next warp, beside thread 0
    float weights = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) weights += warp_sums[kWarps + w];
    exact_add(p.weight_exact, weights);
  }
}

// atomicInc with acquire-release semantics at device scope: the CTA's arrival at the end.
__device__ __forceinline__ unsigned int arrive_acq_rel(unsigned int* counter, unsigned int wrap) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(wrap) : "memory");
  return old;
}

// Rows of ignore_index, counted by warp (an integer sum, the same in any order), then this CTA's
// arrival. Returns whether it is the last CTA to arrive, which has then reset the claims' counter:
// every CTA has made its last claim by then. Every thread must call it.
__device__ __forceinline__ bool arrive_last(const Params& p, unsigned int ignored, bool whole_rows) {
  __shared__ bool is_last_cta;
  if (whole_rows && __any_sync(0xffffffffu, ignored)) {
    const unsigned long long warp_ignored = warp_sum((unsigned long long)ignored);
    if ((threadIdx.x & 31) == 0) atomicAdd(p.ignored_rows, warp_ignored);
  }
  // The barrier orders every thread's writes (segment partials, additions to the exact sum) before
  // thread 0's arrival, whose release publishes them device-wide; in the last CTA its acquire, then
  // the barrier, orders the other CTAs' writes before every thread's reads. One atomic in place of a
  // fence on each side.
  __syncthreads();
  if (threadIdx.x == 0) is_last_cta = arrive_acq_rel(p.counter, gridDim.x - 1) == gridDim.x - 1;
  __syncthreads();
  return is_last_cta;
}

// The last CTA's share of whole rows, in thread 0: the chunks' exact sum and the mean's divisor, the
// rows counted or (weighted) the exact sum of their weights.
__device__ __forceinline__ Total whole_rows_total(const Params& p) {
  if (threadIdx.x != 0) return {0.0, 0.0};
  const unsigned long long ignored_rows = __ldcg(p.ignored_rows);  // before the sum's loads: one round trip
  const double sum = exact_sum(p.exact);
  return {sum, weighted(p) ? exact_sum(p.weight_exact) : double(p.rows - ignored_rows)};
}

// The result stored: in the format O (the logits', or the promoted one of probability targets), or in
// float32 where the options build is asked for it (float32_out: autocast's loss from 16-bit logits).
template <class O>
__device__ __forceinline__ void store_out(const Params& p, float v) {
  if (kOptions && p.float32_out) {
    *static_cast<float*>(p.out) = v;
  } else {
    O::store(p.out, v);
  }
}

// The result from the CTA's total, in thread 0: the mean, or in the options build the sum (or
// nothing, for reduction none). It also leaves the ignored rows' count at zero for the next launch.
template <class E>
__device__ __forceinline__ void store_result(const Params& p, Total total) {
  if (threadIdx.x == 0) {
    *p.ignored_rows = 0;
    if (kOptions && p.reduction == kReductionNone) return;
    const bool sum = kOptions && p.reduction == kReductionSum;
    store_out<E>(p, float(sum ? total.sum : total.sum / total.divisor));  // nothing counted: 0/0 = NaN
  }
}

// The weight of a row's class where the options build has weights and the row counts (code: its
// target's, target_code's), else 1: the row's share of the mean's divisor. Loaded where it is
// needed, after the row's reduction, its latency shows: rows in registers copy it ahead of the row
// (copy_class_weight), tiles hold every class's weight in shared memory, and the host gives
// weighted problems no row batches (docs/design, "Options").
template <class E>
__device__ __forceinline__ float weight_at(const Params& p, long long j) {  // class j's, 1 without weights
  return weighted(p) ? load_scalar<E>(static_cast<const typename E::Storage*>(p.weight) + j) : 1.f;
}
template <class E>
__device__ __forceinline__ float class_weight(const Params& p, long long code) {
  return code < 0 ? 1.f : weight_at<E>(p, code);
}

// The class weight for rows in registers, whose loop has no register to spare for it while the
// row streams: the 4-byte word that holds it is copied to the thread's shared-memory slot ahead of
// the row (cp.async; before sm_80 a load and a store) and read back after it. A 16-bit last weight
// that starts a word is loaded alone: its word would reach past the tensor.
template <class E>
__device__ __forceinline__ void copy_class_weight(uint32_t* slot, const Params& p, long long code) {
  if (!weighted(p) || code < 0) return;
  const auto* w = static_cast<const typename E::Storage*>(p.weight) + code;
  const auto at = reinterpret_cast<uintptr_t>(w);
  const auto* word = reinterpret_cast<const uint32_t*>(at & ~uintptr_t(3));
  if (sizeof(*w) == 2 && (at & 2) == 0 && code == p.cols - 1) {
    *slot = __ldg(w);
    return;
  }
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n\tcp.async.commit_group;"
               :: "r"(static_cast<unsigned int>(__cvta_generic_to_shared(slot))), "l"(word) : "memory");
#else
  *slot = __ldg(word);
#endif
}
template <class E>
__device__ __forceinline__ float copied_class_weight(const uint32_t* slot, const Params& p, long long code) {
  if (!weighted(p) || code < 0) return 1.f;
  wait_copies();
  const uint32_t word = *slot;
  if constexpr (sizeof(typename E::Storage) == 4) return __uint_as_float(word);
  const auto at = reinterpret_cast<uintptr_t>(static_cast<const typename E::Storage*>(p.weight) + code);
  return E::value(typename E::Storage(at & 2 ? word >> 16 : word));
}

// What the options build adds to a row's loss in every family: z_loss * lse^2 where the row counts
// (code >= 0), every row's (m, s) where asked, and its loss for reduction none (0 where ignored), in
// float32: one store with no conversion, which the host rounds to the result's dtype where that is
// narrower (a branch on the dtype here costs 16-bit rows kernels spills).
__device__ __forceinline__ float finish_row(const Params& p, long long row, long long code, Lse st, float log_s,
                                            float loss) {
  if (p.z_loss != 0.f && code >= 0) {  // guarded: 0 * inf would be NaN
    const float lse = st.m + log_s;
    loss = fmaf(p.z_loss * lse, lse, loss);
  }
  if (p.row_state) p.row_state[row] = make_float2(st.m, st.s);
  if (p.reduction == kReductionNone)
    p.losses[row] = code == kTargetIgnored ? 0.f : loss;
  return loss;
}

// A row's loss from its (m, s), its target's code (target_code's, or target_kind's where the column
// is not needed) and its target logit: PyTorch's, NaN for a bad target. The options build applies
// the row's options: times its class's weight (class_weight's), label smoothing (from the row's
// Gap), plus z_loss * lse^2, and stores what is asked per row: its loss for reduction none (0 where
// ignored), its (m, s).
template <class E>
__device__ __forceinline__ float row_outcome(const Params& p, long long row, long long code, Lse st, float x_t,
                                             float weight, Gap gap = {0.f, 0.f}) {
  if constexpr (!kOptions) return code >= 0 ? row_loss(st, x_t) : __int_as_float(0x7fc00000);
  const float log_s = logf(st.s);
  float loss = code >= 0 ? weight * (log_s - (x_t - st.m)) : __int_as_float(0x7fc00000);  // weight 1 without weights
  if (smoothing(p) && code >= 0) {
    loss = fmaf(1.f - p.label_smoothing, loss, p.smoothing_per_class * fmaf(gap.weight, log_s, gap.sum));
  }
  return finish_row(p, row, code, st, log_s, loss);
}

// A finished row in its group's leader, for the chunk's sums: its loss (row_outcome's) and class
// weight where it counts; a row of ignore_index adds to the rows the mean's divisor leaves out.
// (Unused where the build has no streamed family.)
[[maybe_unused]] __device__ __forceinline__ void count_row(long long code, float outcome, float w_t, float& loss,
                                                           float& weight, unsigned int& ignored) {
  if (code == kTargetIgnored) {
    ++ignored;
  } else {
    loss = outcome;
    weight = w_t;
  }
}

}  // namespace
