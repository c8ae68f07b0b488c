// The gradient scaled in place (the options build).
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

template <class E>
void launch_scale(const Params& p) {
  cross_entropy_scale_kernel<E><<<p.grid, kThreads, 0, p.stream>>>(p);
}

}  // namespace
