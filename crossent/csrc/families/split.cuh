// A vocabulary split across ranks (the options build; crossent.parallel): each row's two numbers over
// a rank's classes, before the all-gather, and every rank's merged into the row's loss, after it.
#pragma once

#include "../common/row_end.cuh"
#include "../common/softcap.cuh"

namespace {

// A rank's terms of each row, a thread a row, at Params::terms: (lse_r, u_r), the log-sum-exp of its
// classes (m + log s from the forward's row state; -inf where it holds no class: row_state null) and
// its share of the row's linear term, (1 - eps) w_t y_t where it holds the target t (y_t capped where
// asked, w_t its class weight, 1 without), else 0. Label smoothing's sum over its classes the host adds.
template <class E>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_split_terms_kernel(const Params p) {
  const auto* logits = static_cast<const typename E::Storage*>(p.logits);
  for (long long row = (long long)blockIdx.x * kThreads + threadIdx.x; row < p.rows;
       row += (long long)gridDim.x * kThreads) {
    const int code = split_target_code(p, target_value(p, load_target_words(p, row)));
    float lse = -INFINITY, u = 0.f;
    if (p.row_state) {
      const float2 st = p.row_state[row];
      lse = st.x + logf(st.y);
    }
    if (code >= 0) {
      float y = load_scalar<E>(logits + row * p.row_stride + code * p.class_stride);
      if (p.softcap != 0.f) y = logit<SoftCapped<E>>(p, y);  // as the forward caps it
      u = (1.f - p.label_smoothing) * weight_at<E>(p, p.class_start + code) * y;
    }
    p.terms[row] = make_float2(lse, u);
  }
}

// Every rank's terms (Params::terms, ranks x rows) merged, a thread a row, by the same operations in
// the same order on every rank: lse = log sum_r exp(lse_r) (PyTorch's logsumexp: an infinite max
// shifts nothing), u = sum_r u_r, and where the row counts its loss a lse - u + z lse^2, with
// a = (1 - eps) w_t + eps / V sum_j w_j (NaN where its target is outside [0, V)). Stores each row's
// lse (Params::lse), its (lse, 1) as the gradient's row state, its loss for reduction none; and sums
// the losses as the loss kernels do (exact sums: the same bits whatever the schedule; the grid depends
// on the rows alone), the last CTA storing the result and, for the mean, 1 / divisor at grad_out.
template <class E>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_split_merge_kernel(const Params p) {
  __shared__ Total scratch[kWarps];
  const float smoothing_total = p.weight_total ? p.smoothing_per_class * *p.weight_total : p.label_smoothing;
  Total mine = {0.0, 0.0};  // the counted rows' losses and class weights
  unsigned int ignored = 0;
  for (long long row = (long long)blockIdx.x * kThreads + threadIdx.x; row < p.rows;
       row += (long long)gridDim.x * kThreads) {
    float m = -INFINITY;
    for (int r = 0; r < p.ranks; ++r) m = fmaxf(m, p.terms[r * p.rows + row].x);
    const float shift = isinf(m) ? 0.f : m;
    float s = 0.f, u = 0.f;
    for (int r = 0; r < p.ranks; ++r) {
      const float2 term = p.terms[r * p.rows + row];
      s += expf(term.x - shift);
      u += term.y;
    }
    const float lse = logf(s) + shift;
    const long long target = target_value(p, load_target_words(p, row));
    const int kind = target_kind(p, target);  // the launch's columns: every rank's classes
    float loss = 0.f;
    if (kind == kTargetIgnored) {
      ++ignored;
    } else if (kind == kTargetCounted) {
      const float w_t = weight_at<E>(p, target);
      loss = ((1.f - p.label_smoothing) * w_t + smoothing_total) * lse - u;
      if (p.z_loss != 0.f) loss += p.z_loss * lse * lse;  // guarded: 0 * inf would be NaN
      mine.sum += loss;
      mine.divisor += w_t;
    } else {
      loss = __int_as_float(0x7fc00000);
      mine.sum += loss;
    }
    p.lse[row] = lse;
    p.row_state[row] = make_float2(lse, 1.f);
    if (p.reduction == kReductionNone) p.losses[row] = loss;
  }
  const Total cta = cta_sum(mine, scratch);
  if (threadIdx.x == 0) {
    exact_add(p.exact, float(cta.sum));
    if (weighted(p)) exact_add(p.weight_exact, float(cta.divisor));
  }
  if (!arrive_last(p, ignored, true)) return;
  const Total total = whole_rows_total(p);
  if (threadIdx.x == 0 && p.reduction == kReductionMean) *static_cast<float*>(p.grad_out) = float(1.0 / total.divisor);
  store_result<E>(p, total);
}

template <class E>
void launch_split(const Params& p) {
  if (p.family == kFamilySplitTerms) cross_entropy_split_terms_kernel<E><<<p.grid, kThreads, 0, p.stream>>>(p);
  else cross_entropy_split_merge_kernel<E><<<p.grid, kThreads, 0, p.stream>>>(p);
}

}  // namespace
