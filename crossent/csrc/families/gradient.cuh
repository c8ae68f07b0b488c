// The gradient (the options build).
#pragma once

#include "streamed.cuh"

namespace {

// The options build's backward: d loss / d logits, and where asked d loss / d probability targets,
// from every row's (m, s), which the forward saves, in one read of the logits (the probabilities: two, their
// sum first) and one write of the gradient. Row r's, with e_j = exp(y_j - lse) the softmax of its logits y (capped where
// asked), g the loss's incoming gradient (over the mean's divisor: divided by on the device, or after
// a fused forward times its 1 / divisor here, incoming_gradient; the row's own for reduction none) and
// w_j the class weights (1 without):
//   dx_j = (g (a e_j - b_j) + l e_j) y'_j,   dq_j = g (1 - eps) w_j (lse - y_j)
// b_j: class j's share of the row's loss: for class indices eps / C w_j, plus (1 - eps) w_t at the
// target t; for probabilities q, w_j ((1 - eps) q_j + eps / C) (C: the classes, a split vocabulary's
// all). a: the shares' sum, so that a e_j - b_j cancels exactly where it should (one class). l: the
// incoming gradient of the row's returned log-sum-exp (Params::grad_lse) plus z-loss's 2 z g lse.
// y'_j: the cap's slope, or 1. A row whose loss does not count (ignore_index) has none of g's terms:
// its gradient is exactly 0 where no l reaches it, whatever its logits hold.
// Contiguous classes: `group` lanes of a warp take a row, 16-byte vectors where the logits, the
// gradient and the probabilities share their 16-byte grid (the next batch of them in flight while
// this one is written), element by element elsewhere; strided classes: a thread a position, so that
// neighbouring threads read and write neighbouring positions. A row's scalars (target, (m, s), incoming
// gradients) are loaded a row ahead, and its first batch before its class weight: no row waits on a
// chain of loads before its stream starts. After the fused family's forward (Params::grad_in), rows
// whose gradient it wrote for an incoming 1 are left as they are; the rest are written anew from the
// logits, rounded once, rather than scaled.

static_assert(kGradientVecs % 2 == 0, "probabilities take half the vectors a lane: a whole number");
static_assert(4 * kFusedVecs <= 65536 / (kThreads * kCtasPerSm) / 2,
              "the fused family's row takes at most half the registers its launch bounds leave a lane");

// What a row's gradient starts from, loaded a row ahead: its (m, s), its incoming gradients
// (the loss's for reduction none; the log-sum-exp's), its target, and whether the fused forward's
// gradient stands: the loss's incoming gradient as given is 1 and no log-sum-exp's reaches the row.
struct RowInputs {
  float2 state;  // (m, s)
  float g, l;
  TargetWords target;
  bool written;
};
// The loss's incoming gradient g of row i (of every row: 0), as the formula reads it: as given
// (Params::grad_out, in grad_dtype), times the mean's 1 / divisor where grad_scale holds it, rounded once.
__device__ __forceinline__ float incoming_gradient(const Params& p, long long i) {
  const float g = scalar_of(p.grad_dtype, p.grad_out, i);
  return p.grad_scale ? __fmul_rn(g, *p.grad_scale) : g;
}

template <bool kProbs>
__device__ __forceinline__ RowInputs load_row_inputs(const Params& p, long long row) {
  RowInputs in = {{0.f, 1.f}, 0.f, 0.f, {0u, 0u}, false};
  if (row < p.rows) {
    in.state = p.row_state[row];
    if (p.reduction == kReductionNone) in.g = incoming_gradient(p, row);
    if (p.grad_lse) in.l = p.grad_lse[row];
    if (!kProbs) in.target = load_target_words(p, row);
    in.written = p.grad_in && scalar_of(p.grad_dtype, p.grad_in, p.reduction == kReductionNone ? row : 0) == 1.f &&
                 in.l == 0.f;
  }
  return in;
}

// A row's factors, the header's: its max m, a / s and l / s, g, the target's b_t (class indices), its
// lse, the target's column (else -1), and whether its gradient is 0 throughout. e_j s = exp(y_j - m):
// y_j - m is exact near the max, where lse - y_j would carry lse's rounding (a few 1e-7 of every
// element, for logits of magnitude 10 or more), so 1 / s goes into a and l once a row.
struct RowGradient {
  float m, a, l, g, b_t, lse;
  int target;
  bool zero;
  float scale, shift;  // other_class_gradient's: g a + l and g eps / C
};
// From the row's (m, s), g (0 where it does not count, NaN for a bad target), l, a and b_t; z-loss
// adds its 2 z g lse to l where the row counts.
__device__ __forceinline__ RowGradient row_gradient(const Params& p, float2 state, float g, float l, float a, float b_t,
                                                    int target, bool counts) {
  const float lse = state.x + logf(state.y), inv_s = __frcp_rn(state.y);
  if (counts && p.z_loss != 0.f) l = fmaf(2.f * p.z_loss * g, lse, l);
  return {state.x, a * inv_s, l * inv_s, g, b_t, lse, target, !counts && l == 0.f,
          fmaf(g, a * inv_s, l * inv_s), g * p.smoothing_per_class};
}
// A class-index row's: code its target's (split_target_code's), w_t its class weight, all_weights the
// classes' weights' sum (C without), class_weights whether b_j reads w_j. A target elsewhere in a split
// vocabulary weighs in a, with no b_t. (Unused where the build has no gradient.)
[[maybe_unused]] __device__ __forceinline__ RowGradient class_row_gradient(const Params& p, float2 state, long long code,
                                                                          float w_t, float g, float l, float all_weights,
                                                                          bool class_weights) {
  const bool counts = code != kTargetIgnored;
  g = !counts ? 0.f : code == kTargetBad ? __int_as_float(0x7fc00000) : g;  // NaN, as the row's loss
  const float own = code >= 0 || code == kTargetElsewhere ? (1.f - p.label_smoothing) * w_t : 0.f;
  const float a = fmaf(p.smoothing_per_class, all_weights, own);
  const float b_t = fmaf(p.smoothing_per_class, class_weights ? w_t : 1.f, own);
  return row_gradient(p, state, g, l, a, b_t, int(code), counts);
}

// dx_j of one element, and dq_j for probabilities: its logit x, class weight w (1 where no share
// reads it), probability q (0 for class indices) and whether it is the target. a e_j - b_j in one FMA:
// where the row has one class, exactly 0; and where e_t is near 1, as near as float32 holds it.
template <class L, bool kProbs>
__device__ __forceinline__ float element_gradient(const Params& p, const RowGradient& r, float x, float w, float q,
                                                  bool target, float& dq) {
  float slope;
  const float y = logit_and_slope<L>(p, x, slope);
  const float e = exp2_approx((y - r.m) * kLog2e);  // e_j s
  const float b = kProbs ? class_share<true>(p, w, q) : target ? r.b_t : p.smoothing_per_class * w;
  if constexpr (kProbs) dq = r.g * (1.f - p.label_smoothing) * w * (r.lse - y);
  return r.zero ? 0.f : fmaf(r.g, fmaf(r.a, e, -b), r.l * e) * slope;
}

// dx_j of a class other than the target where b_j holds no class weight (b_j = eps / C: class indices,
// and no class weights with label smoothing) and the logits are not capped: (g a + l) e_j - g eps / C in
// one FMA, where element_gradient takes four and the target's test. Both kernels write every such
// element so, in vectors or one by one, and the target's by element_gradient: the same bits from either.
// Not for a row whose gradient is 0 throughout (r.zero): its exps may be NaN.
__device__ __forceinline__ float other_class_gradient(const RowGradient& r, float x) {
  return fmaf(exp2_approx((x - r.m) * kLog2e), r.scale, -r.shift);
}
// Whether this lane's vectors hold column `target` (-1 or less: none) of a row whose `group` lanes take
// cut's vectors in turn: the lane that writes the target's element again after its vectors.
template <class L>
__device__ __forceinline__ bool holds_target(int target, const Aligned& cut, int group, int lane) {
  const int t_off = target - cut.head;
  return target >= 0 && unsigned(t_off) < unsigned(cut.nvec * L::kPerVec) &&
         ((t_off / L::kPerVec) & (group - 1)) == lane;
}

template <class L, class P, bool kStrided>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_gradient_kernel(const Params p) {
  constexpr bool kProbs = kIsProbs<P>;
  using S = typename L::Storage;
  using PF = ProbsFormat<L, P>;
  using PS = typename PF::Storage;
  constexpr bool kVectors = !kStrided && sizeof(PS) == sizeof(S);  // (else no row has whole vectors)
  constexpr int kVecs = kProbs ? kGradientVecs / 2 : kGradientVecs;  // two streams: as many bytes in flight
  constexpr int kElems = 4;  // elements in flight a lane, off the vectors
  const int group = kStrided ? 1 : p.group;  // lanes a row, at most a warp's
  const int lane = threadIdx.x & (group - 1);
  const int cols = int(p.cols);
  const long long stride = kStrided ? p.class_stride : 1;
  const long long rows_a_step = (long long)gridDim.x * (kThreads / group);
  const bool class_weights = weighted(p) && (kProbs || smoothing(p));  // where a share reads w_j
  const float g_all = p.reduction == kReductionNone ? 0.f : incoming_gradient(p, 0);  // the mean's and the sum's
  const float all_weights = weighted(p) && !kProbs && smoothing(p) ? *p.weight_total
                            : float(p.classes ? p.classes : p.cols);
  if (p.grad_in && p.reduction != kReductionNone && scalar_of(p.grad_dtype, p.grad_in, 0) == 1.f && !p.grad_lse)
    return;  // written throughout

  long long row = blockIdx.x * (kThreads / group) + threadIdx.x / group;
  RowInputs next = load_row_inputs<kProbs>(p, row);
  // Every lane of a warp runs each step, live row or not: the group's sum shuffles across it.
  for (; row - threadIdx.x / group < p.rows; row += rows_a_step) {
    const RowInputs in = next;
    next = load_row_inputs<kProbs>(p, row + rows_a_step);
    const bool live = row < p.rows;
    const int len = live && !in.written ? cols : 0;
    const long long n = kStrided ? row / p.class_stride : row, s = kStrided ? row - n * p.class_stride : 0;
    const S* x_row = static_cast<const S*>(p.logits) + n * p.row_stride + s;
    S* dx_row = static_cast<S*>(p.grad) + n * p.grad_row_stride + s;
    const PS* q_row = nullptr;
    PS* dq_row = nullptr;
    if constexpr (kProbs) {
      q_row = static_cast<const PS*>(p.probs) + n * p.probs_stride + s;
      dq_row = static_cast<PS*>(p.grad_probs) + n * p.grad_row_stride + s;
    }
    // Whole vectors where every stream shares the logits' 16-byte grid: their first batch goes out now.
    Aligned cut = {len, 0};
    if constexpr (kVectors) {
      const auto grid_of = [](const void* a) { return reinterpret_cast<uintptr_t>(a) & 15; };
      const uintptr_t at = grid_of(x_row);
      if (grid_of(dx_row) == at && (!kProbs || (grid_of(q_row) == at && (!p.grad_probs || grid_of(dq_row) == at))))
        cut = align_stretch<L>(x_row, len);
    }
    const uint4* x_vecs = reinterpret_cast<const uint4*>(x_row + cut.head);
    const uint4* q_vecs = kProbs ? reinterpret_cast<const uint4*>(q_row + cut.head) : nullptr;
    uint4 xb[kVecs], qb[kVecs];
    auto load_batch = [&](int v0) {
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int v = v0 + u * group;
        xb[u] = v < cut.nvec ? x_vecs[v] : uint4{};
        if constexpr (kProbs) qb[u] = v < cut.nvec ? q_vecs[v] : uint4{};
      }
    };
    if constexpr (kVectors) load_batch(lane);

    // The row's factors.
    const float g = p.reduction == kReductionNone ? in.g : g_all;
    RowGradient r;
    if constexpr (kProbs) {
      float a = 0.f;
      for (int j = lane; j < len; j += group)
        a += class_share<true>(p, class_weights ? weight_at<L>(p, j) : 1.f, load_scalar<PF>(q_row + j * stride));
      r = row_gradient(p, in.state, g, in.l, lanes_sum(a, group), 0.f, -1, true);
    } else {
      const long long target = target_value(p, in.target);
      const long long code = live ? split_target_code(p, target) : kTargetIgnored;
      // the weights counted from the first column's (the host's pointer), the target's wherever it lies
      const float w_t = code >= 0 || code == kTargetElsewhere ? weight_at<L>(p, target - p.class_start) : 1.f;
      r = class_row_gradient(p, in.state, code, w_t, g, in.l, all_weights, class_weights);
    }

    // Element by element: the edges around the vectors, or the whole row.
    const bool plain = !kProbs && !kSoftCapped<L> && !class_weights && !r.zero;  // other_class_gradient's rows
    const int nedge = len - cut.nvec * L::kPerVec;
    for (int k0 = lane; k0 < nedge; k0 += kElems * group) {
      float x[kElems], q[kElems];
#pragma unroll
      for (int u = 0; u < kElems; ++u) {
        const long long j = edge_element<L>(cut, min(k0 + u * group, nedge - 1));
        x[u] = load_scalar<L>(x_row + j * stride);
        q[u] = 0.f;
        if constexpr (kProbs) q[u] = load_scalar<PF>(q_row + j * stride);
      }
#pragma unroll
      for (int u = 0; u < kElems; ++u) {
        if (k0 + u * group >= nedge) break;
        const int j = edge_element<L>(cut, k0 + u * group);
        float dq = 0.f;
        const float dx = plain && j != r.target ? other_class_gradient(r, x[u])
                         : element_gradient<L, kProbs>(p, r, x[u], class_weights ? weight_at<L>(p, j) : 1.f, q[u],
                                                       j == r.target, dq);
        L::store(dx_row + j * stride, dx);
        if (kProbs && p.grad_probs) PF::store(dq_row + j * stride, dq);
      }
    }
    if constexpr (kVectors) {
      // Where other_class_gradient writes the vectors, the lane whose vector holds the target writes
      // that element again after them, from its logit loaded now (in place, the vector overwrites it).
      const bool owner = plain && holds_target<L>(r.target, cut, group, lane);
      const float x_own = owner ? L::value(x_row[r.target]) : 0.f;  // not __ldg's: this thread's store follows
      uint4* dx_vecs = reinterpret_cast<uint4*>(dx_row + cut.head);
      uint4* dq_vecs = kProbs ? reinterpret_cast<uint4*>(dq_row + cut.head) : nullptr;
      auto write_vectors = [&](auto dx_of) {
        for (int v0 = lane; v0 < cut.nvec; v0 += kVecs * group) {
          uint4 xc[kVecs], qc[kVecs];
#pragma unroll
          for (int u = 0; u < kVecs; ++u) xc[u] = xb[u], qc[u] = qb[u];
          load_batch(v0 + kVecs * group);
#pragma unroll
          for (int u = 0; u < kVecs; ++u) {
            const int v = v0 + u * group;
            if (v >= cut.nvec) break;
            const int col = cut.head + v * L::kPerVec;
            float dx[L::kPerVec], dq[L::kPerVec];
#pragma unroll
            for (int i = 0; i < L::kPerVec; ++i)
              dx[i] = dx_of(L::at(xc[u], i), kProbs ? PF::at(qc[u], i) : 0.f, col + i, dq[i]);
            dx_vecs[v] = vector_of<L>(dx);
            if (kProbs && p.grad_probs) dq_vecs[v] = vector_of<PF>(dq);
          }
        }
      };
      if (plain) {
        write_vectors([&](float x, float, int, float&) { return other_class_gradient(r, x); });
      } else {
        write_vectors([&](float x, float q, int col, float& dq) {
          const float w = class_weights ? weight_at<L>(p, col) : 1.f;
          return element_gradient<L, kProbs>(p, r, x, w, q, col == r.target, dq);
        });
      }
      float unused;
      if (owner) L::store(dx_row + r.target, element_gradient<L, false>(p, r, x_own, 1.f, 0.f, true, unused));
    }
  }
}


template <class E>
void launch_gradient(const Params& p) {
  launch_options_instance<E>(p, [&](auto logits, auto targets, auto strided) {
    cross_entropy_gradient_kernel<decltype(logits), decltype(targets), decltype(strided)::value>
        <<<p.grid, kThreads, 0, p.stream>>>(p);
  });
}

}  // namespace
