// A row's target: its kind (counted, ignored, out of range) and its words.
#pragma once

#include "arch.cuh"

namespace {

// The skipped target: PyTorch's default, or in the options build the launch's.
__device__ __forceinline__ long long ignore_index(const Params& p) { return kOptions ? p.ignore_index : kIgnoreIndex; }
// Whether a row counts (kTargetCounted), is skipped (ignore_index) or yields NaN (outside [0, cols));
// kTargetElsewhere: split_target_code's.
constexpr int kTargetCounted = 0, kTargetIgnored = -1, kTargetBad = -2, kTargetElsewhere = -4;
__device__ __forceinline__ int target_kind(const Params& p, long long target) {
  return target == ignore_index(p) ? kTargetIgnored : (target >= 0 && target < p.cols) ? kTargetCounted : kTargetBad;
}
// A target as stored in shared memory: its column where the row counts, else its kind.
__device__ __forceinline__ int target_code(const Params& p, long long target) {
  const int kind = target_kind(p, target);
  return kind == kTargetCounted ? int(target) : kind;
}
// The gradient's, where the columns may be a slice [class_start, class_start + cols) of a vocabulary
// of Params::classes split across ranks (0: not split): a target among the other classes counts, with
// no column here (kTargetElsewhere). Unsplit, target_code's.
__device__ __forceinline__ int split_target_code(const Params& p, long long target) {
  if (target == ignore_index(p)) return kTargetIgnored;
  const unsigned long long column = (unsigned long long)target - p.class_start;  // before the slice: past cols
  if (column < (unsigned long long)p.cols) return int(column);
  return (unsigned long long)target < (unsigned long long)p.classes ? kTargetElsewhere : kTargetBad;
}

// Whether the launch reads the logits of every row, ignored ones and bad targets' too: the options
// build, where it stores every row's (m, s) (Params::row_state).
__device__ __forceinline__ bool every_row(const Params& p) { return kOptions && p.row_state != nullptr; }

// A row's target as two 32-bit words, for int64 and int32 targets alike: a kernel that reads them
// so needs no instance per target type, and no select between two loads in flight, which would
// wait for them on the spot. For int32 both words are the target.
struct TargetWords {
  uint32_t lo, hi;
};
__device__ __forceinline__ TargetWords load_target_words(const Params& p, long long row) {
  const int words = p.target_bytes / 4;
  const uint32_t* t = static_cast<const uint32_t*>(p.targets) + row * p.target_stride * words;
  return {t[0], t[words - 1]};
}
__device__ __forceinline__ long long target_value(const Params& p, TargetWords w) {
  return p.target_bytes == 8 ? (long long)(uint64_t(w.hi) << 32 | w.lo) : (long long)int(w.lo);
}

}  // namespace
