// Family: row batches.
#pragma once

#include "../common/row_end.cuh"

namespace {

// Where kBatchRows whole rows fill one batch of the CTA exactly (kThreads x kRowBatchLoads 16-byte
// vectors, 16 KB; 32768 x 4096 in every dtype), a chunk is one such batch, and each row has
// kThreads / kBatchRows threads (whole warps) that hold kRowBatchLoads of its vectors each. The next
// chunk's loads go out before this one's rows are reduced, into a second set of registers, so every
// CTA keeps a batch in flight through its reductions; the two sets trade roles from one step to the
// next, never through a copy (a register copy of a load in flight waits for it). Each warp reduces
// its share of its row with butterflies and leaves (m, s) in shared memory, and the thread that
// holds the target logit leaves it beside them. After the chunk's one barrier a single warp, a
// different one each chunk, merges the rows and adds the chunk's loss sum to the exact sum, while
// the others stream on ("Rows that fill a CTA batch").
constexpr int kTargetPast = -3;  // a row of the last chunk past the last row

template <class E, int kBatchRows, bool kEvictFirst>
struct RowBatch {
  using Format = E;
  static constexpr int kRows = kBatchRows;
  static constexpr int kRowThreads = kThreads / kBatchRows;  // a row's threads
  static_assert(kRowThreads % 32 == 0, "whole warps per row");
  // The row's vectors (threadIdx.x % kRowThreads) + j * kRowThreads, of row threadIdx.x / kRowThreads.
  uint4 vec[kRowBatchLoads];
  TargetWords target;  // the row's

  __device__ __forceinline__ void issue(const Params& p, long long chunk) {
    const long long row = chunk * kBatchRows + threadIdx.x / kRowThreads;
    if (row < p.rows) {  // false only in the last chunk, for whole warps
      const uint4* v = reinterpret_cast<const uint4*>(static_cast<const typename E::Storage*>(p.logits) + row * p.row_stride) +
                       threadIdx.x % kRowThreads;
#pragma unroll
      for (int j = 0; j < kRowBatchLoads; ++j) vec[j] = load_vec<kEvictFirst>(v + j * kRowThreads);
      target = load_target_words(p, row);
    }
  }

  // This warp's (m, s) of its row into state[warp]; the row's target code into codes[row], and
  // the target logit into x_t[row] where the row counts. Rows past the last (in the last chunk) are
  // reduced too, from stale registers, and never counted.
  __device__ __forceinline__ void reduce(const Params& p, long long chunk, float2* state, float* x_t, int* codes) const {
    const float m = lanes_max(vectors_max<E>(vec), 32);
    const float s = warp_sum(vectors_sum_exp<E>(vec, safe_base(m), 0.f));
    if ((threadIdx.x & 31) == 0) state[threadIdx.x >> 5] = make_float2(m, s);

    // Column t is element t % kPerVec of the row's vector t / kPerVec. Only the thread that would
    // hold it by the target's low word, and the row's first thread, which stores the row's code,
    // classify the target in full: every thread doing so cost a quarter of the loop's instructions.
    const int r = threadIdx.x / kRowThreads, i = threadIdx.x % kRowThreads;
    const uint32_t v = target.lo / E::kPerVec;
    if (v % kRowThreads != uint32_t(i) && i != 0) return;
    const long long target_class = target_value(p, target);  // ahead of the row test: the order ptxas schedules best
    const int code = chunk * kBatchRows + r < p.rows ? target_code(p, target_class) : kTargetPast;
    if (i == 0) codes[r] = code;
    if (code >= 0 && v % kRowThreads == uint32_t(i)) x_t[r] = E::at(vector_at(vec, v / kRowThreads), code % E::kPerVec);
  }
};

// One warp after the chunk's barrier: lane w takes warp w's (m, s), a butterfly merges each row's
// warps, and the rows' losses are summed in row order, then added to the exact sum.
template <class E, int kBatchRows>
__device__ __forceinline__ void merge_batch_rows(const Params& p, long long chunk, const float2* state, const float* x_t,
                                                 const int* codes, unsigned int& ignored) {
  constexpr int kRowWarps = kWarps / kBatchRows;
  const int lane = threadIdx.x & 31, r = lane / kRowWarps;
  const float2 part = lane < kWarps ? state[lane] : make_float2(-INFINITY, 0.f);
  Lse st = {part.x, part.y};
  lse_reduce_lanes(st, kRowWarps);
  float loss = 0.f, weight = 0.f;
  if (lane % kRowWarps == 0 && r < kBatchRows && codes[r] != kTargetPast) {
    const int code = codes[r];
    // Loaded here, the merging warp waits for it each chunk: the host's policy gives weighted
    // problems to rows in registers instead (policy._family).
    const float row_weight = class_weight<E>(p, code);
    const float row_loss = row_outcome<E>(p, chunk * kBatchRows + r, code, st, code >= 0 ? x_t[r] : 0.f, row_weight);
    if (code == kTargetIgnored) {
      ++ignored;
    } else {
      loss = row_loss;
      weight = row_weight;
    }
  }
  for (int offset = kRowWarps; offset < kWarps; offset <<= 1) {
    loss += __shfl_xor_sync(0xffffffffu, loss, offset);
    if (weighted(p)) weight += __shfl_xor_sync(0xffffffffu, weight, offset);
  }
  if (lane == 0) {
    exact_add(p.exact, loss);
    if (weighted(p)) exact_add(p.weight_exact, weight);
  }
}

// One chunk: claim, issue the next chunk's loads, reduce this one's rows, and after the barrier
// merge them in one warp (`merger`, the next one each chunk). A function, not a lambda, so that it
// is inlined at both of its calls and the batches stay in registers (as a lambda it kept them on
// the stack).
template <class Batch>
__device__ __forceinline__ void row_batch_step(const Params& p, const Batch& cur, Batch& next, int parity,
                                               ChunkClaims& claims, int& merger, unsigned int& ignored) {
  constexpr int kRows = Batch::kRows;
  __shared__ float2 state[2][kWarps];         // by chunk parity, as the rest
  __shared__ float target_logit[2][kRows];
  __shared__ int target_codes[2][kRows];
  __shared__ long long claimed[2];            // the chunk after next
  const unsigned int claim = claims.claim(p.counter + 1);
  if (claims.next < p.chunks) next.issue(p, claims.next);
  cur.reduce(p, claims.chunk, state[parity], target_logit[parity], target_codes[parity]);
  claims.publish(&claimed[parity], claim);
  __syncthreads();
  if (int(threadIdx.x >> 5) == merger)
    merge_batch_rows<typename Batch::Format, kRows>(p, claims.chunk, state[parity], target_logit[parity],
                                                    target_codes[parity], ignored);
  merger = (merger + 1) % kWarps;
  claims.advance(&claimed[parity]);
}

template <class E, int kBatchRows, bool kEvictFirst>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_row_batches_kernel(const Params p) {
  ChunkClaims claims;
  int merger = 0;
  unsigned int ignored = 0;  // the merging lanes' rows of ignore_index
  RowBatch<E, kBatchRows, kEvictFirst> a = {}, b = {};  // zeros: the last chunk's missing rows read them
  if (claims.chunk < p.chunks) a.issue(p, claims.chunk);
  while (claims.chunk < p.chunks) {  // the same in every thread
    row_batch_step(p, a, b, 0, claims, merger, ignored);
    if (claims.chunk >= p.chunks) break;
    row_batch_step(p, b, a, 1, claims, merger, ignored);
  }
  if (!arrive_last(p, ignored, true)) return;
  reset_claims(p.counter + 1);
  store_result<E>(p, whole_rows_total(p));
}

}  // namespace
