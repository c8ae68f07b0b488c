// The launch: the instance a parameter block names, and the host's entry points (device_attributes,
// launch_params, unpack_params), which module.cpp binds.
#include "families/one_row.cuh"
#include "families/row_batches.cuh"
#include "families/rows.cuh"
#include "families/tiles.cuh"

namespace {

// The options build's families, which it puts ahead of this file (families/streamed.cuh, gradient.cuh,
// fused.cuh, scale.cuh with the round family, split.cuh); the default build has none of them and never
// names them (kOptions).
template <class E>
void launch_streamed(const Params& p);
template <class E>
void launch_gradient(const Params& p);
template <class E>
void launch_fused(const Params& p);
template <class E>
void launch_scale(const Params& p);
template <class E>
void launch_split(const Params& p);

// The instance the plan names: its family and the family's compile-time choice. Plain loads have
// no instance without the lead: there a lone thread's lead is 0 anyway (item_layout), and the
// host's lead_256 only tells evict-first rows apart.
template <class E, class Target, bool kEvictFirst>
void launch_instance(const Params& p) {
  const dim3 grid(p.grid), block(kThreads);
  const cudaStream_t s = p.stream;
  switch (p.family) {
    case kFamilyOneRow:
      cross_entropy_one_row_kernel<E><<<1, p.group, 0, s>>>(p);
      break;
    case kFamilyRowBatches:
      if (p.batch_rows == 1) cross_entropy_row_batches_kernel<E, 1, kEvictFirst><<<grid, block, 0, s>>>(p);
      else cross_entropy_row_batches_kernel<E, 2, kEvictFirst><<<grid, block, 0, s>>>(p);
      break;
    case kFamilyTiles:
      if (p.sweeps == kVectorSweeps) cross_entropy_tiles_kernel<E, Target, kVectorSweeps, kEvictFirst><<<grid, block, 0, s>>>(p);
      else if (p.sweeps == kPairSweeps) cross_entropy_tiles_kernel<E, Target, kPairSweeps, kEvictFirst><<<grid, block, 0, s>>>(p);
      else cross_entropy_tiles_kernel<E, Target, kElementSweeps, kEvictFirst><<<grid, block, 0, s>>>(p);
      break;
    case kFamilyRows: {
      const size_t seg_smem = p.splits > 1 ? kSegSlab * sizeof(float4) + kThreads * sizeof(int) : 0;  // segments_total's slab
      if constexpr (kEvictFirst) {
        if (!p.lead_256) {
          cross_entropy_rows_kernel<E, Target, true, false><<<grid, block, seg_smem, s>>>(p);
          break;
        }
      }
      cross_entropy_rows_kernel<E, Target, kEvictFirst, true><<<grid, block, seg_smem, s>>>(p);
    }
  }
}

template <class E, class Target>
void launch_for_loads(const Params& p) {
  if (p.evict_first) launch_instance<E, Target, true>(p);
  else launch_instance<E, Target, false>(p);
}

template <class E>
void launch_for_family(const Params& p) {
  if constexpr (kOptions) {
    if (p.family == kFamilyStreamed) return launch_streamed<E>(p);
    if (p.family == kFamilyGradient) return launch_gradient<E>(p);
    if (p.family == kFamilyFused) return launch_fused<E>(p);
    if (p.family == kFamilyScale || p.family == kFamilyRound) return launch_scale<E>(p);
    if (p.family == kFamilySplitTerms || p.family == kFamilySplitMerge) return launch_split<E>(p);
  }
  if (p.target_bytes == 8) launch_for_loads<E, long long>(p);
  else launch_for_loads<E, int>(p);
}

}  // namespace

// The driver's figures for the host's launch policy, as int32s in kDeviceAttributes' order
// (crossent.gpu.DEVICE_ATTRIBUTES).
std::string device_attributes(int device) {
  constexpr int n = sizeof kDeviceAttributes / sizeof kDeviceAttributes[0];
  int values[n];
  for (int i = 0; i < n; ++i) {
    const cudaError_t err = cudaDeviceGetAttribute(&values[i], kDeviceAttributes[i], device);
    if (err != cudaSuccess) throw std::runtime_error(std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(err));
  }
  return std::string(reinterpret_cast<const char*>(values), sizeof values);
}

// The launch of a parameter block, checked against the instances this build has.
void launch_params(const Params& p) {
  const bool options_family = kOptions && (p.family == kFamilyStreamed || p.family == kFamilyGradient ||
                                            p.family == kFamilyFused || p.family == kFamilyScale ||
                                            p.family == kFamilySplitTerms || p.family == kFamilySplitMerge ||
                                            p.family == kFamilyRound);
  const bool known = (p.family == kFamilyRows || p.family == kFamilyTiles || p.family == kFamilyRowBatches ||
                      p.family == kFamilyOneRow || options_family) &&
                     (p.dtype == kFloat32 || p.dtype == kBFloat16 || p.dtype == kFloat16) &&
                     (p.probs_dtype == kClassIndices || p.probs_dtype == kFloat32 || p.probs_dtype == p.dtype) &&
                     (p.family != kFamilyStreamed || p.class_stride == 1 || p.group == 1 || p.group == kQuad) &&
                     ((p.family != kFamilyGradient && p.family != kFamilyScale) ||
                      (p.group >= 1 && p.group <= 32 && (p.group & (p.group - 1)) == 0 && p.class_stride >= 1)) &&
                     (p.family != kFamilyFused ||
                      (p.group >= (p.dtype == kFloat32 ? 8 : 16) && p.group <= kThreads * kFusedClusterCtas &&
                       (p.group & (p.group - 1)) == 0 &&
                       (p.group <= kThreads || (p.softcap == 0.f && p.grid % (p.group / kThreads) == 0)) &&
                       p.probs_dtype == kClassIndices &&
                       p.class_stride == 1)) &&
                     (p.family != kFamilySplitMerge || p.ranks >= 1) && (p.family != kFamilyRound || p.grad_scale);
  if (!known) throw std::invalid_argument("cross-entropy launch: unknown kernel family or dtype");
  int previous = 0;
  cudaGetDevice(&previous);
  if (previous != p.device) cudaSetDevice(p.device);
  if (p.dtype == kFloat32) launch_for_family<F32>(p);
  else if (p.dtype == kBFloat16) launch_for_family<BF16>(p);
  else launch_for_family<F16>(p);
  const cudaError_t err = cudaGetLastError();
  if (previous != p.device) cudaSetDevice(previous);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("cross-entropy kernel launch failed: ") + cudaGetErrorString(err));
}

// A parameter block as the host packed it (crossent.params.PARAMS, the layout of Params).
Params unpack_params(const std::string& block) {
  Params p;
  if (block.size() != sizeof p) throw std::invalid_argument("cross-entropy launch: the parameter block has the wrong size");
  std::memcpy(&p, block.data(), sizeof p);
  return p;
}

void launch_cross_entropy(const std::string& block) { launch_params(unpack_params(block)); }
