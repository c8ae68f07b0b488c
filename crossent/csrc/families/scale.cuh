// Scaling (the options build): a gradient scaled in place, and float32 sums scaled into their dtype.
#pragma once

#include "../common/row_end.cuh"

namespace {

// Where the forward wrote the gradient over the logits (inplace), the backward has no logits to read:
// each row holds its gradient for an incoming 1, which is linear in it, and a row whose incoming
// gradient g is not 1 is multiplied by g (a 16-bit gradient so rounds twice). Rows as the gradient
// family lays them out, `group` lanes a row; where one g serves every row and it is 1, nothing to do.
template <class E>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_scale_kernel(const Params p) {
  using S = typename E::Storage;
  const bool per_row = p.reduction == kReductionNone;
  if (!per_row && scalar_of(p.grad_dtype, p.grad_in, 0) == 1.f) return;
  const int group = p.group, lane = threadIdx.x & (group - 1);
  const long long stride = p.class_stride;
  for (long long row = (long long)blockIdx.x * (kThreads / group) + threadIdx.x / group; row < p.rows;
       row += (long long)gridDim.x * (kThreads / group)) {
    const float g = scalar_of(p.grad_dtype, p.grad_in, per_row ? row : 0);
    if (g == 1.f) continue;
    const long long n = row / stride, s = row - n * stride;
    S* dx_row = static_cast<S*>(p.grad) + n * p.grad_row_stride + s;
#pragma unroll 4
    for (long long j = lane; j < p.cols; j += group) E::store(dx_row + j * stride, load_scalar<E>(dx_row + j * stride) * g);
  }
}

// A float32 sum scaled and rounded once into its own dtype E: the linear loss's gradients of its input,
// weight and bias, summed over the chunks in float32 (crossent/linear.py). The rows x cols floats at
// p.logits, row r times its factor p.grad_scale[r] (reduction none) or all of them times
// p.grad_scale[0], into p.grad. A piece is kWidth elements: a vector's (E::kPerVec: one or two 16-byte
// loads, one 16-byte store) where rows are whole vectors and both arrays sit on the 16-byte grid, else
// one; a thread has up to kBatch pieces loaded before it stores any, which keeps enough bytes in flight
// where the sum is large (where it is small, the grid gives a thread one: policy.round_grid).
template <class E, int kWidth>
__device__ __forceinline__ void round_pieces(const Params& p) {
  using S = typename E::Storage;
  constexpr int kBatch = 4;
  const long long per_row = p.cols / kWidth, n = p.rows * per_row, threads = (long long)gridDim.x * kThreads;
  const bool by_row = p.reduction == kReductionNone;
  const float all = __ldg(p.grad_scale);
  const float* sum = static_cast<const float*>(p.logits);
  S* out = static_cast<S*>(p.grad);
  for (long long i0 = (long long)blockIdx.x * kThreads + threadIdx.x; i0 < n; i0 += kBatch * threads) {
    float v[kBatch][kWidth];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const long long i = i0 + u * threads;
      if (i >= n) break;
      if constexpr (kWidth == 1) {
        v[u][0] = __ldcs(sum + i);
      } else {
#pragma unroll
        for (int h = 0; h < kWidth / 4; ++h) {
          const float4 f = __ldcs(reinterpret_cast<const float4*>(sum) + i * (kWidth / 4) + h);
          v[u][4 * h] = f.x, v[u][4 * h + 1] = f.y, v[u][4 * h + 2] = f.z, v[u][4 * h + 3] = f.w;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const long long i = i0 + u * threads;
      if (i >= n) break;
      const float g = by_row ? __ldg(p.grad_scale + i / per_row) : all;
#pragma unroll
      for (int k = 0; k < kWidth; ++k) v[u][k] *= g;
      if constexpr (kWidth == 1) E::store(out + i, v[u][0]);
      else reinterpret_cast<uint4*>(out)[i] = vector_of<E>(v[u]);
    }
  }
}

template <class E>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_round_kernel(const Params p) {
  const bool on_grid = ((reinterpret_cast<uintptr_t>(p.logits) | reinterpret_cast<uintptr_t>(p.grad)) & 15) == 0;
  if (on_grid && p.cols % E::kPerVec == 0) round_pieces<E, E::kPerVec>(p);
  else round_pieces<E, 1>(p);
}

template <class E>
void launch_scale(const Params& p) {
  if (p.family == kFamilyRound) cross_entropy_round_kernel<E><<<p.grid, kThreads, 0, p.stream>>>(p);
  else cross_entropy_scale_kernel<E><<<p.grid, kThreads, 0, p.stream>>>(p);
}

}  // namespace
