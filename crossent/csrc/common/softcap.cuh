// Soft-capped logits (the options build): each logit x read as softcap * tanh(x / softcap).
#pragma once

#include "lse.cuh"

namespace {

// E's logits, each passed through the cap as it becomes a float (logit).
template <class E>
struct SoftCapped : E {};
template <class E>
constexpr bool kSoftCapped = false;
template <class E>
constexpr bool kSoftCapped<SoftCapped<E>> = true;

// A logit as the loss sees it, and its slope d y / d x. Soft-capped: softcap * tanh(x / softcap), as
// softcap - 2 softcap / (1 + e^(2x / softcap)): an exp and a reciprocal, both approximate, off by a
// few softcap * 2^-24 at most, where the sum of exp counts each logit's error once ("Soft-capping").
// -inf gives -softcap, +inf softcap, NaN NaN. The slope (the gradient's): with r = 1 / (1 + e),
// 1 - (y / softcap)^2 = 4 r (1 - r), where 1 - r = e r is taken from e while e is small, so that
// neither cancels; where it is not used, the compiler drops it.
template <class E>
__device__ __forceinline__ float logit_and_slope(const Params& p, float x, float& slope) {
  slope = 1.f;
  if constexpr (kSoftCapped<E>) {
    const float e = exp2_approx(x * p.softcap_rate);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
    slope = 4.f * r * (e < 1.f ? e * r : 1.f - r);
    return fmaf(-2.f * p.softcap, r, p.softcap);
  }
  return x;
}
template <class E>
__device__ __forceinline__ float logit(const Params& p, float x) {
  float slope;
  return logit_and_slope<E>(p, x, slope);
}

}  // namespace
