// Family: streamed rows (the options build).
#pragma once

#include "../common/row_end.cuh"
#include "../common/softcap.cuh"

namespace {

// What the other families do not take: probability targets, inputs of shape (N, C, d1, ..., dk)
// whose classes lie d1 * ... * dk elements apart ("strided"), class weights with label smoothing,
// and soft-capped logits (SoftCapped formats, common/softcap.cuh). A row (one sample
// position) streams through once and nothing of it is held: a running (m, s), a Gap and, for class
// indices, the target's logit and class weight, loaded as the row starts. Every loss here is
// sum_j c_j (lse - x_j), one Gap's W log(s) + sum_j c_j (base - x_j), with c_j the class's share:
// w_j ((1 - eps) p_j + eps / C) for probability targets p (w_j = 1 without weights), w_j in label
// smoothing's term for class indices. Contiguous classes: `group` threads (a power of two up to the
// CTA) take a row's 16-byte vectors in turn, kStreamVecs at a time (the class weights' beside them,
// where they share the logits' 16-byte grid), or kStreamWords words of logits and probabilities;
// strided classes: a thread per position, or per four neighbouring ones where their logits share a
// load (stream_quad), so that neighbouring threads read neighbouring positions and each class's
// loads coalesce. A chunk is a CTA's worth of rows, claimed as the other families claim theirs, and
// its sum goes to the exact sum.
static_assert(kStreamVecs <= kBatch && kStreamWords <= kBatch, "a streamed batch in the registers of a row's batch");
struct ClassIndices {};  // the targets of a streamed launch without probability targets
template <class P>
constexpr bool kIsProbs = !std::is_same<P, ClassIndices>::value;
template <class E, class P>  // the probabilities' format; the logits' where there are none
using ProbsFormat = typename std::conditional<kIsProbs<P>, P, E>::type;

// Class j's share of the row's loss given its weight (weight_at's); prob: p_j.
template <bool kProbs>
__device__ __forceinline__ float class_share(const Params& p, float weight, float prob) {
  return kProbs ? weight * fmaf(1.f - p.label_smoothing, prob, p.smoothing_per_class) : weight;
}

// One value's exp and gap, of share c: x - base feeds both. (Unused where the build has no streamed family.)
[[maybe_unused]] __device__ __forceinline__ void exp_and_gap(float x, float base, float c, float& s, Gap& gap) {
  const float d = x - base;
  s += exp2_approx(d * kLog2e);
  gap.sum = fmaf(c, -d, gap.sum);
  gap.weight += c;
}

// Adds the first n of K values x[k] (the rest -inf) to a row's running (m, s), and where `shares`
// to its Gap with share(k) each: one rescale of both, then an exp (and a gap) each. -inf adds
// exp(-inf) = 0, so only the gaps need n; the test of `shares` is made once: inside the loop, its
// predicated code cost every value its instructions.
template <int K, class Share>
__device__ __forceinline__ void stream_add(Lse& st, Gap& gap, const float (&x)[K], int n, bool shares, Share share) {
  float m = st.m;
#pragma unroll
  for (int k = 0; k < K; ++k) m = fmaxf(m, x[k]);
  const float base = safe_base(m);
  float s = st.s * exp2_approx((st.m - base) * kLog2e);
  if (shares) {
    gap = gap_rebase(gap, safe_base(st.m), base);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < n) exp_and_gap(x[k], base, share(k), s, gap);
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) s += exp2_approx((x[k] - base) * kLog2e);
  }
  st = {m, s};
}

// Columns first, first + step, ... < end of a row, one element at a time, `stride` elements apart:
// a strided row, or a contiguous row whose probabilities lie off its logits' 16-byte grid.
template <class E, class P>
__device__ __forceinline__ void stream_elements(const Params& p, const typename E::Storage* x_row,
                                                const void* p_row, long long stride, int first, int step, int end,
                                                Lse& st, Gap& gap) {
  constexpr bool kProbs = kIsProbs<P>;
  constexpr int kElems = kProbs ? 8 : 16;  // loads in flight, as many as registers allow
  using PS = typename ProbsFormat<E, P>::Storage;
  const bool shares = kProbs || smoothing(p);
  const long long hop = stride * step;  // pointers stepped along: an index times the stride cost a 64-bit product a load
  const auto* xj = x_row + first * stride;
  const PS* pj = static_cast<const PS*>(p_row) + first * stride;
  for (int j0 = first; j0 < end; j0 += kElems * step) {
    float x[kElems], prob[kElems];
#pragma unroll
    for (int k = 0; k < kElems; ++k) {
      const bool valid = j0 + k * step < end;
      x[k] = valid ? logit<E>(p, load_scalar<E>(xj)) : -INFINITY;
      if constexpr (kProbs) prob[k] = valid ? load_scalar<P>(pj) : 0.f;
      xj += hop;
      if constexpr (kProbs) pj += hop;
    }
    stream_add(st, gap, x, min(kElems, (end - j0 + step - 1) / step), shares, [&](int k) {
      float p_k = 0.f;
      if constexpr (kProbs) p_k = prob[k];
      return class_share<kProbs>(p, weight_at<E>(p, j0 + k * step), p_k);
    });
  }
}

// The class weights where a row's vectors read them: on the row's 16-byte grid. Rows that start off
// the weights' grid (the host's choice: policy.weight_phase_bytes) read a copy shifted onto theirs:
// the weights are copied E::kPerVec times (cross_entropy_weight_phases_kernel), copy k so that its
// element j lies on the grid where j % kPerVec == k; a row whose vectors start at column col0 reads
// copy col0 % kPerVec. Read one element at a time instead, they cost the L1 eight loads a vector.
// A copy's elements: whole vectors, with room for its shift.
template <class E>
__host__ __device__ __forceinline__ long long weight_phase_stride(const Params& p) {
  return (p.cols + 2 * E::kPerVec - 2) / E::kPerVec * E::kPerVec;
}
template <class E>
__device__ __forceinline__ const typename E::Storage* row_weights(const Params& p, int col0) {
  using S = typename E::Storage;
  if (p.weight_phases == nullptr) return static_cast<const S*>(p.weight) + col0;
  const int k = col0 % E::kPerVec;
  return static_cast<const S*>(p.weight_phases) + k * weight_phase_stride<E>(p) + (E::kPerVec - k) % E::kPerVec + col0;
}
template <class E>  // copy blockIdx.y
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_weight_phases_kernel(const Params p) {
  using S = typename E::Storage;
  const long long stride = weight_phase_stride<E>(p), i = (long long)blockIdx.x * kThreads + threadIdx.x;
  const int k = blockIdx.y;
  const long long j = i - (E::kPerVec - k) % E::kPerVec;
  if (i < stride)
    static_cast<S*>(p.weight_phases)[k * stride + i] = j >= 0 && j < p.cols ? static_cast<const S*>(p.weight)[j] : S(0);
}

// A contiguous row's whole vectors v = lane, lane + group, ... < nvec, kStreamVecs at a time, with
// the class weights' where shares read them (row_weights'); or with the probabilities' vectors beside
// them (P's 16-byte words per E vector: 2 for float32 probabilities of 16-bit logits), as many as
// keep kStreamWords words in flight (the loads' pace is bytes in flight: "Streamed rows"). Every
// batch but a row's last is whole, and tests no vector against the row's end: at 16 bits those
// tests cost a third as much again as the exps and gaps. col0: the first vector's column.
template <class E, class P>
__device__ __forceinline__ void stream_vectors(const Params& p, const uint4* x_vecs, const void* p_vecs, int col0,
                                               int lane, int group, int nvec, Lse& st, Gap& gap) {
  constexpr bool kProbs = kIsProbs<P>;
  constexpr int kWords = int(sizeof(typename ProbsFormat<E, P>::Storage)) * E::kPerVec / 16;
  const bool shares = kProbs || smoothing(p);
  const bool w_vecs = weighted(p) && shares;
  const auto* w = w_vecs ? row_weights<E>(p, col0) : nullptr;
  constexpr int kVecs = kProbs ? kStreamWords / (1 + kWords) : kStreamVecs;
  // The vectors v0, v0 + group, ...: kVecs of them where kWhole, else those before the row's end.
  auto add_batch = [&](int v0, auto whole) {
    constexpr bool kWhole = decltype(whole)::value;
    const int nvalid = kWhole ? kVecs : min(kVecs, (nvec - v0 + group - 1) / group);
    uint4 xb[kVecs], wb[kVecs];
    [[maybe_unused]] uint4 pb[kVecs][kWords];  // probabilities only
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      // Past the row's end its last vector stands in: the max stays, and the exps stop at nvalid.
      const int v = kWhole ? v0 + u * group : min(v0 + u * group, nvec - 1);
      xb[u] = x_vecs[v];
      if constexpr (kProbs)
#pragma unroll
        for (int k = 0; k < kWords; ++k) pb[u][k] = static_cast<const uint4*>(p_vecs)[v * kWords + k];
      if (w_vecs) wb[u] = reinterpret_cast<const uint4*>(w)[v];
    }
    // The cap rises with x: the capped max is the raw max capped.
    const float m = fmaxf(st.m, logit<E>(p, vectors_max<E>(xb)));
    const float base = safe_base(m);
    float s = st.s * exp2_approx((st.m - base) * kLog2e);
    // Each element's exp and gap, its weight from weight(u, i): with the class weights' vectors or without.
    auto add_gaps = [&](auto weight) {
      gap = gap_rebase(gap, safe_base(st.m), base);
#pragma unroll
      for (int u = 0; u < kVecs; ++u)
        if (u < nvalid)
#pragma unroll
          for (int i = 0; i < E::kPerVec; ++i) {
            float prob = 0.f;
            if constexpr (kProbs) prob = P::at(pb[u][i / P::kPerVec], i % P::kPerVec);
            exp_and_gap(logit<E>(p, E::at(xb[u], i)), base, class_share<kProbs>(p, weight(u, i), prob), s, gap);
          }
    };
    if (!shares && kSoftCapped<E>) {
#pragma unroll
      for (int u = 0; u < kVecs; ++u)
        if (u < nvalid)
#pragma unroll
          for (int i = 0; i < E::kPerVec; ++i) s += exp2_approx((logit<E>(p, E::at(xb[u], i)) - base) * kLog2e);
    }
    else if (!shares) s = vectors_sum_exp<E>(xb, base, s, nvalid);
    else if (w_vecs) add_gaps([&](int u, int i) { return E::at(wb[u], i); });
    else add_gaps([](int, int) { return 1.f; });
    st = {m, s};
  };
  // Whole batches while the group's last lane has one: the test is the same in every lane of the
  // row, which the lanes of one warp would otherwise take apart, running both kinds of batch. Then
  // one batch at most: in every lane the next would start past the row's end.
  int v0 = lane;
  for (; (v0 | (group - 1)) + (kVecs - 1) * group < nvec; v0 += kVecs * group) add_batch(v0, std::true_type{});
  if (v0 < nvec) add_batch(v0, std::false_type{});
}

// One row's (m, s) and Gap in this lane, its share of the row: columns [0, cols), `stride` elements
// apart (kStrided), else contiguous, taken by `group` lanes.
template <class E, class P, bool kStrided>
__device__ __forceinline__ void stream_row(const Params& p, const typename E::Storage* x_row, const void* p_row,
                                           int lane, int group, Lse& st, Gap& gap) {
  const int cols = int(p.cols);
  if constexpr (kStrided) {
    stream_elements<E, P>(p, x_row, p_row, p.class_stride, 0, 1, cols, st, gap);
  } else {
    constexpr bool kProbs = kIsProbs<P>;
    using PS = typename ProbsFormat<E, P>::Storage;
    const Aligned cut = align_stretch<E>(x_row, cols);
    const PS* p_body = static_cast<const PS*>(p_row) + cut.head;
    if (kProbs && (reinterpret_cast<uintptr_t>(p_body) & 15) != 0) {  // the probabilities off the logits' grid
      stream_elements<E, P>(p, x_row, p_row, 1, lane, group, cols, st, gap);
      return;
    }
    for (int k = lane; k < cols - cut.nvec * E::kPerVec; k += group) {  // the edges, one element each
      const int j = edge_element<E>(cut, k);
      const float x[1] = {logit<E>(p, load_scalar<E>(x_row + j))};
      float prob = 0.f;
      if constexpr (kProbs) prob = load_scalar<P>(static_cast<const PS*>(p_row) + j);
      stream_add(st, gap, x, 1, kProbs || smoothing(p), [&](int) { return class_share<kProbs>(p, weight_at<E>(p, j), prob); });
    }
    stream_vectors<E, P>(p, reinterpret_cast<const uint4*>(x_row + cut.head), p_body, cut.head, lane, group, cut.nvec,
                         st, gap);
  }
}

// Four neighbouring positions of strided class indices, a thread's (kQuad): each class's four
// logits are one 16- or 8-byte word, a Quad. A lone position's 2- or 4-byte loads kept too few
// bytes in flight ("Streamed rows"), and so did a thread's registers for 16-bit quads: those are
// copied to shared memory by cp.async, which holds no register while in flight, kQuadClasses
// classes a stage and kQuadStages<E> stages in flight. Each thread copies and reads only its own
// slots, so no barrier is needed: its wait for its own copies is enough. Float32's quads, whose
// stage would be one, are loaded into registers, as many bytes. Adds the positions' losses, class
// weights and ignored rows to the thread's sums.
template <class E>
using Quad = typename std::conditional<sizeof(typename E::Storage) == 4, uint4, uint2>::type;
template <class E>
constexpr int kQuadStages = kQuadStageBytes / (kQuadClasses * kThreads * int(sizeof(Quad<E>)));
template <class E>
__device__ __forceinline__ float quad_at(const Quad<E>& q, int i) {  // position i's logit
  if constexpr (sizeof(typename E::Storage) == 4) return E::at(q, i);
  else return E::at(make_uint4(q.x, q.y, 0u, 0u), i);
}
template <class E>
__device__ __forceinline__ void stream_quad(const Params& p, long long row0, Quad<E>* slots, float& loss_sum,
                                            float& weight_sum, unsigned int& ignored) {
  constexpr int kStages = kQuadStages<E>;
  constexpr bool kStaged = kStages > 1;
  int code[kQuad];
#pragma unroll
  for (int i = 0; i < kQuad; ++i)
    code[i] = row0 + i < p.rows ? target_code(p, target_value(p, load_target_words(p, row0 + i))) : kTargetIgnored;
  Lse st[kQuad];
  Gap gap[kQuad];
  float x_t[kQuad];
#pragma unroll
  for (int i = 0; i < kQuad; ++i) st[i] = {-INFINITY, 0.f}, gap[i] = {0.f, 0.f}, x_t[i] = 0.f;
  const int cols = int(p.cols);
  const bool shares = smoothing(p);
  if (row0 < p.rows) {  // the logits' copies wait for no target: they go out with the targets' loads
    const long long n = row0 / p.class_stride, s = row0 - n * p.class_stride;
    const auto* x0 = static_cast<const typename E::Storage*>(p.logits) + n * p.row_stride + s;
    const long long stride = p.class_stride;
    const auto* xj = x0;  // the next class to copy: a pointer stepped along, where an index times the stride cost a 64-bit product a load
    const int batches = (cols + kQuadClasses - 1) / kQuadClasses;
    auto slot = [&](int batch, int k) -> Quad<E>& { return slots[((batch % kStages) * kQuadClasses + k) * kThreads]; };
    Quad<E> neg_inf;  // past the row's classes: exp(-inf) = 0
    const uint4 neg_inf_words = neg_inf_vec<E>();
    memcpy(&neg_inf, &neg_inf_words, sizeof neg_inf);
    auto load = [&](int j) { return j < cols ? *reinterpret_cast<const Quad<E>*>(xj) : neg_inf; };
    auto stage = [&](int batch) {  // batch's copies, one commit group (empty past the row: the waits count groups)
      if (kStaged && batch < batches)
#pragma unroll
        for (int k = 0; k < kQuadClasses; ++k) {
          if (batch * kQuadClasses + k < cols) copy_async(&slot(batch, k), reinterpret_cast<const Quad<E>*>(xj));
          else slot(batch, k) = neg_inf;
          xj += stride;
        }
      commit_copies();
    };
    if constexpr (kStaged)
#pragma unroll
      for (int b = 0; b < kStages; ++b) stage(b);
    for (int b = 0; b < batches; ++b) {
      Quad<E> q[kQuadClasses];
      const int j0 = b * kQuadClasses, nvalid = min(kQuadClasses, cols - j0);
      if constexpr (kStaged) {
        wait_copies_but<kStages - 1>();  // batch b's group has landed
#pragma unroll
        for (int k = 0; k < kQuadClasses; ++k) q[k] = slot(b, k);
      } else {
#pragma unroll
        for (int k = 0; k < kQuadClasses; ++k) {
          q[k] = load(j0 + k);
          xj += stride;
        }
      }
#pragma unroll
      for (int i = 0; i < kQuad; ++i) {
        float x[kQuadClasses];
#pragma unroll
        for (int k = 0; k < kQuadClasses; ++k) {
          x[k] = kSoftCapped<E> && k >= nvalid ? -INFINITY : logit<E>(p, quad_at<E>(q[k], i));  // capped -inf is finite
          if (j0 + k == code[i]) x_t[i] = x[k];  // the target's logit, picked out on the way
        }
        stream_add(st[i], gap[i], x, nvalid, shares, [&](int k) { return weight_at<E>(p, j0 + k); });
      }
      if constexpr (kStaged) stage(b + kStages);  // into the slots just read: their values are used above, so the reads are done
    }
  }
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
    if (row0 + i >= p.rows) continue;
    const float weight = class_weight<E>(p, code[i]);
    const float loss = row_outcome<E>(p, row0 + i, code[i], st[i], x_t[i], weight, gap[i]);
    if (code[i] == kTargetIgnored) {
      ++ignored;
    } else {
      loss_sum += loss;
      weight_sum += weight;
    }
  }
}

template <class E, class P, bool kStrided>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_streamed_kernel(const Params p) {
  constexpr bool kProbs = kIsProbs<P>;
  using O = ProbsFormat<E, P>;  // the result's format: the promoted dtype
  __shared__ float4 warp_state[2][kWarps];  // group_merge's, by chunk parity
  __shared__ float2 warp_gaps[2][kWarps];
  __shared__ float warp_sums[2][kChunkSums];
  __shared__ long long claimed[2];
  extern __shared__ uint4 dynamic_smem[];  // quads: the staged copies (launch_streamed_for)
  auto* quad_slots = reinterpret_cast<Quad<E>*>(dynamic_smem);
  const int group = kStrided ? 1 : p.group;
  const bool quads = kStrided && !kProbs && p.group == kQuad;  // strided: p.group is the positions a thread
  const int lane = threadIdx.x & (group - 1);
  const int group_id = threadIdx.x / group;
  const auto* logits = static_cast<const typename E::Storage*>(p.logits);
  // A chunk's rows: a CTA's worth. Class indices are loaded a chunk ahead, so that no row's stream
  // waits on its target's load (quads load theirs as the chunk starts).
  auto row_of = [&](long long chunk) {
    return quads ? (chunk * kThreads + threadIdx.x) * kQuad : chunk * (kThreads / group) + group_id;
  };
  auto load_target = [&](long long chunk) {
    const long long row = row_of(chunk);
    return kProbs || quads || row >= p.rows ? TargetWords{0u, 0u} : load_target_words(p, row);
  };
  ChunkClaims claims;
  TargetWords next_target = load_target(claims.chunk);
  unsigned int ignored = 0;  // group leaders: the rows of ignore_index they met

  for (int parity = 0; claims.chunk < p.chunks; parity ^= 1) {  // the same in every thread
    const unsigned int claim = claims.claim(p.counter + 1);
    const long long row = row_of(claims.chunk);
    if (quads) {
      float loss = 0.f, weight = 0.f;
      stream_quad<E>(p, row, quad_slots + threadIdx.x, loss, weight, ignored);
      end_chunk(p, true, loss, weight, 1, warp_sums[parity], claims, claim, &claimed[parity]);
      claims.advance(&claimed[parity]);
      continue;
    }
    const bool live = row < p.rows;
    const TargetWords target = next_target;
    next_target = load_target(claims.next);
    const long long code = kProbs || !live ? 0 : target_code(p, target_value(p, target));
    Lse st = {-INFINITY, 0.f};
    Gap gap = {0.f, 0.f};
    float x_t = 0.f, w_t = 1.f;
    if (live && (code != kTargetIgnored || every_row(p))) {
      // The row's first element: sample n's position s, of d1 * ... * dk, where classes are strided.
      const long long n = kStrided ? row / p.class_stride : row, s = kStrided ? row - n * p.class_stride : 0;
      const auto* x_row = logits + n * p.row_stride + s;
      const void* p_row = nullptr;
      if constexpr (kProbs) p_row = static_cast<const typename P::Storage*>(p.probs) + n * p.probs_stride + s;
      if (!kProbs && lane == 0 && code >= 0) {
        x_t = logit<E>(p, load_scalar<E>(x_row + code * (kStrided ? p.class_stride : 1)));
        w_t = class_weight<E>(p, code);
      }
      stream_row<E, P, kStrided>(p, x_row, p_row, lane, group, st, gap);
    }
    if (group > 1) group_merge(st, x_t, 0, group, lane, group_id, warp_state[parity], true, gap, warp_gaps[parity]);
    float loss = 0.f, weight = 0.f;  // group leaders: the row's, where it counts
    if (live && lane == 0) {
      if constexpr (kProbs) {
        const float log_s = logf(st.s);
        loss = finish_row(p, row, 0, st, log_s, fmaf(gap.weight, log_s, gap.sum));
      } else {
        count_row(code, row_outcome<E>(p, row, code, st, x_t, w_t, gap), w_t, loss, weight, ignored);
      }
    }
    end_chunk(p, true, loss, weight, group, warp_sums[parity], claims, claim, &claimed[parity]);
    claims.advance(&claimed[parity]);
  }

  if (!arrive_last(p, ignored, true)) return;
  reset_claims(p.counter + 1);
  Total total = whole_rows_total(p);
  if (kProbs) total.divisor = double(p.rows);  // probability targets: the mean is over rows, weighted or not
  store_result<O>(p, total);
}


// A streamed or gradient launch's instance: launch(L{}, P{}, kStrided) with L the logits' format (E,
// or SoftCapped<E>), P the targets' (ClassIndices, or the probabilities' format: float32 or E) and
// kStrided a std::bool_constant, whether classes are strided.
template <class E, class Launch>
void launch_options_instance(const Params& p, Launch launch) {
  auto for_targets = [&](auto logits, auto strided) {
    switch (p.probs_dtype) {
      case kClassIndices: return launch(logits, ClassIndices{}, strided);
      case kFloat32: return launch(logits, F32{}, strided);
      default: return launch(logits, E{}, strided);  // the logits' dtype
    }
  };
  auto for_layout = [&](auto logits) {
    if (p.class_stride > 1) for_targets(logits, std::true_type{});
    else for_targets(logits, std::false_type{});
  };
  if (p.softcap != 0.f) for_layout(SoftCapped<E>{});
  else for_layout(E{});
}

template <class E>
void launch_streamed(const Params& p) {
  launch_options_instance<E>(p, [&](auto logits, auto targets, auto strided) {
    using L = decltype(logits);
    using P = decltype(targets);
    constexpr bool kStrided = decltype(strided)::value;
    const size_t quad_smem = kStrided && !kIsProbs<P> && p.group == kQuad && kQuadStages<E> > 1 ?
                              kQuadStages<E> * kQuadClasses * kThreads * sizeof(Quad<E>) : 0;
    if (!kStrided && p.weight_phases) {
      const dim3 copies(unsigned((weight_phase_stride<E>(p) + kThreads - 1) / kThreads), E::kPerVec);
      cross_entropy_weight_phases_kernel<E><<<copies, kThreads, 0, p.stream>>>(p);
    }
    cross_entropy_streamed_kernel<L, P, kStrided><<<p.grid, kThreads, quad_smem, p.stream>>>(p);
  });
}

}  // namespace
