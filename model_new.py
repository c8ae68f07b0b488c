"""Cross-entropy loss (mean over rows) in one CUDA launch: KernelBench level 1, problem 95.

ModelNew()(logits, targets) equals cross_entropy(logits, targets) with PyTorch's defaults
(mean reduction, ignore_index -100) for float32, bfloat16 and float16 logits of shape (N, C) or
(C,) and int64 or int32 class-index targets. The result is a 0-dim tensor of the logits' dtype.

How: one kernel reads every logit once and writes nothing of size N x C. Each row is reduced
to (max, sum of exp) in fp32, the target logit picked out on the way; each chunk of rows has its
losses summed in a fixed order and added, by integer atomics, to a fixed-point number that holds
any float exactly; the last CTA to finish converts it and divides. So the mean comes out of the
same launch, with no memset, no second kernel, no host synchronization and no float atomics:
integer additions give the same bits in any order, so every run gives the same bits.

Where to look: _CUDA_SRC holds the kernel (its header comment gives the algorithm), _plan is
the launch policy, _cross_entropy_mean the dispatch, ModelNew the module the harness loads.

A target outside [0, C) other than -100 makes the result NaN. Set CROSS_ENTROPY_CHECK_TARGETS=1
(or build ModelNew(check_targets=True)) to get a ValueError naming the first bad row instead;
the check costs a host synchronization, so it is off by default.
"""
import functools
import inspect
import os
import subprocess
from typing import NamedTuple

import torch
from torch.utils.cpp_extension import CUDA_HOME, load_inline

_CUDA_SRC = r"""
// Cross-entropy, mean reduction, fused into one launch.
//
// Fused: max, sum of exp, log, the target gather, the per-row loss, the sum over rows and the
// division by the number of counted rows. Eager PyTorch writes log_softmax (N x C) and reads it
// back; here the logits are read once and only a few bytes per chunk of rows are written, so
// the kernel runs at the speed of one streaming read of the logits.
//
// Per row: loss = log(sum_j exp(x_j - m)) - (x_t - m), with m the row max (PyTorch's own
// formulation: it stays exact for huge logits). Rows whose target is -100 are skipped and not
// counted; a target outside [0, C) yields NaN.
//
// Work decomposition (the host's _plan chooses splits, group, tiles and grid):
//   item  : a row, or one of `splits` segments of a row when rows are too few to fill the GPU;
//   group : `group` consecutive threads (a power of two) that reduce one item together;
//   chunk : `rounds` items per group of a CTA (the CTA's `groups` = kThreads / group groups
//           take one item each per round); chunks interleave, so a round of neighbouring chunks
//           covers neighbouring items. Short rows (a few KB at most) come in tiles instead: a
//           chunk is `tile_rows` whole rows, loaded by the whole CTA as one stretch of memory
//           and reduced from shared memory (see "short rows" below). Where one or two rows fill a
//           CTA's batch of loads exactly (16 KB: 4096 float32 or 8192 16-bit columns a row, or half
//           that), a chunk is such a batch, streamed by its own kernel with the next batch always in
//           flight (see "rows that tile a CTA batch" below). A lone row of up to 128 KB is one
//           CTA's, in registers, by a kernel of its own (see "one row" below).
// CTA b takes chunks b and gridDim.x + b, then claims the next unclaimed chunk from a counter
// while any are left. Claiming balances the end: with a fixed share each, CTAs on the same
// tensor finished up to 30 us apart (SMs stream at different rates), and the last ones ran with
// the DRAM half idle. Claims come in order, so the grid still sweeps the tensor front to back.
// Where a round of a CTA reads only a few KB (very short rows) claims cost more than they
// balance, and the plan gives each CTA one chunk of many rounds: a fixed share, as before.
// Determinism survives the dynamic schedule because no float is summed in an order that depends on
// timing: each chunk's losses are summed in group order, and the chunks' sums go into one
// fixed-point accumulator wide enough to hold any float exactly, by integer atomics (see "the exact
// sum" below); integer addition gives the same bits in any order, and so does the count of rows of
// ignore_index. The last CTA converts that sum once and divides: it reads 88 bytes, not a partial
// per chunk. Segments store an (m, s, x_t) triple per item instead, which the last CTA merges per
// row. The last CTA is found with a counter that an atomic increment returns to zero by itself, and
// resets the claim counter, the ignored rows' count and the accumulator, so the workspace needs
// zeroing once, at allocation.
//
// Loads: the logits stream through plain 16-byte loads, or evict-first ones where they are at most
// a few L2 sizes (the host's _evict_first says why). A row's short last batch comes by cp.async into
// shared memory, with the batch before it (reduce_segment).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = CE_THREADS;         // threads per CTA, shared with the host policy
constexpr int kCtasPerSm = CE_CTAS_PER_SM;   // resident CTAs per SM: caps registers per thread
constexpr int kBatch = CE_BATCH;             // 16-byte loads in flight per thread before first use
constexpr int kShortTail = CE_SHORT_TAIL;    // a row's last batch of at most this many vectors a thread rides along
                                             // with the batch before it (reduce_segment)
constexpr int kTileTargets = CE_TILE_TARGETS;  // targets each thread loads per tile of short rows
constexpr int kSegSlab = CE_SEG_SLAB;        // segment partials the last CTA stages at a time: splits <= kSegSlab
constexpr int kWarps = kThreads / 32;
constexpr long long kIgnoreIndex = -100;     // PyTorch's default ignore_index
constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  const void* logits;
  const void* targets;
  void* out;                   // one element of the logits' dtype
  unsigned int* counter;       // [0]: CTAs that finished, modulo gridDim.x; [1]: chunks claimed
  unsigned long long* ignored_rows;  // rows whose target is ignore_index (splits == 1), beside them
  unsigned long long* exact;   // when splits == 1: the chunks' loss sums, exactly (see "the exact sum")
  float4* seg_partials;        // per item when splits > 1: (m, s, x_t, unused)
  long long rows, cols, row_stride, target_stride;
  long long items;             // rows * splits
  long long chunks;            // the CTAs' work units: chunk_rounds items per group of a CTA, or a tile
  int splits, seg_len, group, chunk_rounds;
  int tile_rows;               // rows per tile where short rows are staged in shared memory; else 0
  int batch_rows;              // rows per chunk where they fill a CTA batch exactly (1 or 2); else 0
  bool lead_256;               // rows in registers may be counted from the 256-byte grid: the launch's choice of kLead256
  bool one_row;                // a lone row of up to a batch per thread: the one-row kernel, on `group` threads
  int target_bytes;            // 8 (int64) or 4 (int32)
};

// ------------------------------------------------------------------ element formats
// Each format turns the words of a 16-byte vector, or one stored element, into floats, and stores
// the result. Conversions are spelled in PTX so the file needs no fp16 headers. A Pair is two
// neighbouring elements read from shared memory in one load (short_row_pair_sweeps): a 32-bit word
// of a 16-bit format, 8 bytes of float32; low() and high() unpack it, pair_max() takes the max of
// two pairs element by element, and word_max() the larger element of one.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ float half_bits_to_float(uint32_t bits) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(bits)));
  return f;
}

struct F32 {
  using Storage = float;
  static constexpr int kPerVec = 4;
  static constexpr uint32_t kNegInfWord = 0xff800000u;
  __device__ static float at(const uint4& v, int i) { return __uint_as_float(word(v, i)); }
  __device__ static uint32_t max2(uint32_t a, uint32_t b) { return __float_as_uint(fmaxf(__uint_as_float(a), __uint_as_float(b))); }
  __device__ static float word_max(uint32_t w) { return __uint_as_float(w); }
  __device__ static float value(Storage x) { return x; }
  __device__ static Storage neg_inf() { return -INFINITY; }
  __device__ static void store(void* out, float v) { *static_cast<float*>(out) = v; }

  using Pair = float2;
  __device__ static Pair neg_inf_pair() { return make_float2(-INFINITY, -INFINITY); }
  __device__ static Pair pair_max(Pair a, Pair b) { return make_float2(fmaxf(a.x, b.x), fmaxf(a.y, b.y)); }
  __device__ static float low(Pair w) { return w.x; }
  __device__ static float high(Pair w) { return w.y; }
  __device__ static float word_max(Pair w) { return fmaxf(w.x, w.y); }
};

// The 16-bit formats: two elements per word, the low half first. Unpacking follows from the
// format's value(); only its packed max and its rounding store are its own.
template <class Format>
struct Packed16 {
  using Storage = unsigned short;
  using Pair = uint32_t;
  static constexpr int kPerVec = 8;
  __device__ static float at(const uint4& v, int i) {
    const uint32_t w = word(v, i >> 1);
    return low((i & 1) ? w >> 16 : w);
  }
  __device__ static float low(uint32_t w) { return Format::value(Storage(w)); }
  __device__ static float high(uint32_t w) { return Format::value(Storage(w >> 16)); }
  __device__ static float word_max(uint32_t w) { return fmaxf(low(w), high(w)); }
  __device__ static Pair neg_inf_pair() { return Format::kNegInfWord; }
  __device__ static Pair pair_max(Pair a, Pair b) { return Format::max2(a, b); }
  __device__ static Storage neg_inf() { return Storage(Format::kNegInfWord); }
};

struct BF16 : Packed16<BF16> {
  static constexpr uint32_t kNegInfWord = 0xff80ff80u;
  __device__ static uint32_t max2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
  }
  __device__ static float value(Storage x) { return __uint_as_float(uint32_t(x) << 16); }
  __device__ static void store(void* out, float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *static_cast<unsigned short*>(out) = h;
  }
};

struct F16 : Packed16<F16> {
  static constexpr uint32_t kNegInfWord = 0xfc00fc00u;
  __device__ static uint32_t max2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
  }
  __device__ static float value(Storage x) { return half_bits_to_float(x); }
  __device__ static void store(void* out, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *static_cast<unsigned short*>(out) = h;
  }
};

// One scalar from global memory, as a float.
template <class E>
__device__ __forceinline__ float load_scalar(const typename E::Storage* p) { return E::value(__ldg(p)); }

// ------------------------------------------------------------------ streaming loads
// A 16-byte global load, plain or evict-first (ld.global.cs: L2 replaces the line before any
// other, so the rest of L2 stays). When each pays off is the host's _evict_first. A compile-time
// choice: as a run-time one, it cost the short-row tiles registers and time (bench/PERF.md).
template <bool kEvictFirst>
__device__ __forceinline__ uint4 load_vec(const uint4* p) {
  if constexpr (kEvictFirst) return __ldcs(p);
  else return *p;
}

// A 16-byte copy from global to shared memory that holds no register while in flight (cp.async),
// evict-first in L2 where the loads are; and the wait for all of a thread's copies.
template <bool kEvictFirst>
__device__ __forceinline__ void copy_vec_async(uint4* dst, const uint4* src) {
  const unsigned int to = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
  if constexpr (kEvictFirst) {
    asm volatile("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n\t"
                 "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, policy;\n\t}" :: "r"(to), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(to), "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ------------------------------------------------------------------ online log-sum-exp
// (m, s): the largest value seen and the sum of exp(x - m) over the values seen.
struct Lse {
  float m, s;
};

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The exponent's base: 0 while every value seen is -inf, so that those values contribute
// exp(-inf) = 0 instead of exp(-inf + inf) = NaN. NaN logits still reach the sum (fmaxf skips
// them, exp does not), and +inf gives NaN through inf - inf, both as in PyTorch.
__device__ __forceinline__ float safe_base(float m) { return m == -INFINITY ? 0.f : m; }

__device__ __forceinline__ Lse lse_merge(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  const float base = safe_base(m);
  return {m, a.s * exp2_approx((a.m - base) * kLog2e) + b.s * exp2_approx((b.m - base) * kLog2e)};
}

// Sum of exp(x - base) over a lane's values, each as exp2 of one FMA: x * log2(e) - c, with
// c = base * log2(e) rounded. The rounding error of that product, d = c - base * log2(e), is exact
// (an FMA gives it) and shifts every exponent alike, so the sum comes out scaled by exactly 2^-d and
// is corrected once. Each exponent is then rounded once, where (x - base) * log2(e) rounds twice,
// and costs one instruction instead of two. A base this large or larger (or not finite) takes the
// two-instruction form: there d would be as large as the exponents themselves.
// sum_exp2(exponent) must return the lane's sum of exp2(exponent(x)).
constexpr float kFoldLimit = 0x1p20f;

template <class SumExp2>
__device__ __forceinline__ float sum_exp(float base, SumExp2 sum_exp2) {
  if (fabsf(base) < kFoldLimit) {
    const float c = base * kLog2e;
    return sum_exp2([c](float x) { return fmaf(x, kLog2e, -c); }) * exp2_approx(-fmaf(base, kLog2e, -c));
  }
  return sum_exp2([base](float x) { return (x - base) * kLog2e; });
}

// The largest element of n vectors. It runs on the stored words (packed pairs for 16-bit formats),
// so no unpacked copy of the vectors stays live until their exps.
template <class E, int N>
__device__ __forceinline__ float vectors_max(const uint4 (&v)[N]) {
  uint4 mx = v[0];
#pragma unroll
  for (int u = 1; u < N; ++u) {
    mx.x = E::max2(mx.x, v[u].x);
    mx.y = E::max2(mx.y, v[u].y);
    mx.z = E::max2(mx.z, v[u].z);
    mx.w = E::max2(mx.w, v[u].w);
  }
  return E::word_max(E::max2(E::max2(mx.x, mx.y), E::max2(mx.z, mx.w)));
}

// s plus the sum of exp(x - base) over the elements of the first nvalid of n vectors, in two chains.
// The exponent stays (x - base) * log2(e) here: sum_exp's folded form measured no faster on rows
// streamed through registers, whose pace the loads set (bench/PERF.md), and needs a branch.
template <class E, int N>
__device__ __forceinline__ float vectors_sum_exp(const uint4 (&v)[N], float base, float s, int nvalid = N) {
  float s1 = 0.f;
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (u < nvalid)  // the vectors past nvalid hold -inf: exp adds 0, so a partial batch skips them
#pragma unroll
      for (int i = 0; i < E::kPerVec; i += 2) {
        s += exp2_approx((E::at(v[u], i) - base) * kLog2e);
        s1 += exp2_approx((E::at(v[u], i + 1) - base) * kLog2e);
      }
  return s + s1;
}

// One batch of vectors: one rescale of the running sum, then one exp per element.
template <class E>
__device__ __forceinline__ Lse lse_add_batch(Lse st, const uint4 (&buf)[kBatch], int nvalid = kBatch) {
  const float m = fmaxf(st.m, vectors_max<E>(buf));
  const float base = safe_base(m);
  return {m, vectors_sum_exp<E>(buf, base, st.s * exp2_approx((st.m - base) * kLog2e), nvalid)};
}

// log_softmax(x)[t] = x_t - m - log(s); all -inf rows give NaN (-inf - -inf), as in PyTorch.
__device__ __forceinline__ float row_loss(Lse st, float x_target) {
  return logf(st.s) - (x_target - st.m);
}

// ------------------------------------------------------------------ reductions
// Butterflies over `width` lanes (a power of two <= 32): every lane ends with the result. Max and
// sum are both commutative bit for bit, so all lanes agree and the result never depends on timing.
__device__ __forceinline__ float lanes_max(float v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
template <class T>
__device__ __forceinline__ T lanes_sum(T v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_sum(T v) { return lanes_sum(v, 32); }

// The merged (m, s) of `width` lanes, in every lane. The max goes first, then each lane rescales its
// sum to it once and the sums go: one exp per lane, where merging (m, s) pairs round by round costs
// two exps a round.
__device__ __forceinline__ void lse_reduce_lanes(Lse& st, int width) {
  const float m = lanes_max(st.m, width);
  const float s = st.s * exp2_approx((st.m - safe_base(m)) * kLog2e);  // +inf max: inf - inf = NaN, as in PyTorch
  st = {m, lanes_sum(s, width)};
}

// A loss sum and a row count. Summed together, so the final reduction costs one round of the CTA.
struct Total {
  double sum;
  unsigned long long count;
};

// Fixed-order sum over the CTA; the total is valid in thread 0. Every thread must call it.
__device__ Total cta_sum(Total v, Total* scratch) {
  v.sum = warp_sum(v.sum);
  v.count = warp_sum(v.count);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  Total total = {0.0, 0ull};
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total = {total.sum + scratch[w].sum, total.count + scratch[w].count};
  __syncthreads();
  return total;
}

// atomicInc with acquire-release semantics at device scope: the CTA's arrival at the end.
__device__ __forceinline__ unsigned int arrive_acq_rel(unsigned int* counter, unsigned int wrap) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(wrap) : "memory");
  return old;
}

__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ------------------------------------------------------------------ one item
// A stretch of `len` elements cut at 16-byte boundaries: `head` elements before the first
// boundary, then `nvec` whole vectors, then fewer than kPerVec elements after them.
struct Aligned {
  int head, nvec;
};
template <class E>
__device__ __forceinline__ Aligned align_stretch(const typename E::Storage* p, int len) {
  const int misalign = int(reinterpret_cast<uintptr_t>(p) & 15) / int(sizeof(typename E::Storage));
  const int head = min(misalign ? E::kPerVec - misalign : 0, len);
  return {head, (len - head) / E::kPerVec};
}

// The elements outside the whole vectors, numbered 0, 1, ...: the head, then what follows the
// vectors. edge_element gives edge k's place in the stretch, edge_number the inverse.
template <class E>
__device__ __forceinline__ int edge_element(const Aligned& cut, int k) {
  return k < cut.head ? k : k + cut.nvec * E::kPerVec;
}
template <class E>
__device__ __forceinline__ int edge_number(const Aligned& cut, int e) {
  return e < cut.head ? e : e - cut.nvec * E::kPerVec;
}

// Vector `slot` of an array held in registers, slot known only at run time. Masks, not
// `if (slot == j) q = v[j]`: from that, the compiler derived v[slot], an indexed load that put the
// whole array in local memory.
template <int N>
__device__ __forceinline__ uint4 vector_at(const uint4 (&v)[N], uint32_t slot) {
  uint4 q = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const uint32_t keep = 0u - uint32_t(slot == uint32_t(j));
    q = make_uint4(q.x | (v[j].x & keep), q.y | (v[j].y & keep), q.z | (v[j].z & keep), q.w | (v[j].w & keep));
  }
  return q;
}

// Folds columns [0, len) of `seg` into this thread's (m, s). The 16-byte-aligned body streams
// through kBatch vectors per thread; the few elements before the first 16-byte boundary and after
// the last are read as scalars, so any start address and row stride work, at full speed wherever
// rows are aligned.
// The target logit, column tcol of the segment (-1: not in it), is picked out of the stream by the
// lane that reads it, into x_t; every lane of the group gets that lane's index in t_lane. A load of
// its own per row, even of a sector the stream was about to read, measured 0.3-1.1 us slower.
template <class E, bool kEvictFirst, bool kLead256>
__device__ __forceinline__ Lse reduce_segment(const typename E::Storage* seg, int len, int lane, int group, int tcol,
                                              uint4* tail_slots, float& x_t, int& t_lane) {
  Lse st = {-INFINITY, 0.f};
  const Aligned cut = align_stretch<E>(seg, len);
  const auto [head, nvec] = cut;
  const int tail = head + nvec * E::kPerVec;
  // The target as the group reads it: element t_elem of vector t_vec, or edge t_edge.
  const bool t_body = tcol >= head && tcol < tail;
  const int t_vec = (tcol - head) / E::kPerVec, t_elem = (tcol - head) % E::kPerVec;
  const int t_edge = tcol < 0 || t_body ? -1 : edge_number<E>(cut, tcol);
  // With kLead256 (the host's _lead_256 says where) the body's vectors are counted from the 256-byte
  // boundary at or below its start, `lead` vectors before it that no lane loads, so that each warp's
  // load covers whole 256-byte blocks of memory: rows off that grid streamed up to 2.5% slower (8192 x
  // 50257 fp32: 556.3 us against 541.9, against 540.7 for 50240 columns, whose rows lie on it). A
  // thread alone on its row never takes it: its first batch, kBatch vectors, could not cover a lead of
  // up to 15, and its warp's load spans 32 rows whatever the grid.
  const int lead = kLead256 && group > 1 ? int(reinterpret_cast<uintptr_t>(seg + head) >> 4) & 15 : 0;
  const int end = lead + nvec;
  t_lane = (t_body ? lead + t_vec : max(t_edge, 0)) & (group - 1);
  // At most 2 * (kPerVec - 1) elements lie outside the aligned body, read as scalars. A lane's first,
  // edge `lane`, is folded in (fold_edge) only after the first batch's loads have gone out too, so a
  // row off the 16-byte grid costs no round trip of its own: folded first, each such row waited one
  // for a few bytes before its body's loads left (8192 x 16001 bf16: 111.9 us against 99.5, 53687 x
  // 2500 bf16 110.9 against 103.4; read: 97.6, 99.5). It waits as stored: converted beside its load,
  // the conversion made the warp wait there. A group of fewer lanes than edges (short rows far apart)
  // folds the rest at once, all their loads out before the first is used: one round trip, not one per
  // element. (Holding those too until the first batch spilled the 16-bit kernels.)
  const int nedge = head + (len - tail);
  typename E::Storage edge = E::neg_inf();
  if (lane < nedge) edge = __ldg(seg + edge_element<E>(cut, lane));
  if (nedge > group) {
    constexpr int kMore = 2 * (E::kPerVec - 1) - 1;  // edges a lane may hold past its first
    float x[kMore];
#pragma unroll
    for (int k = 0; k < kMore; ++k) {
      const int e = lane + (k + 1) * group;
      x[k] = ((k + 1) * group < nedge && e < nedge) ? load_scalar<E>(seg + edge_element<E>(cut, e)) : -INFINITY;
      if (e == t_edge) x_t = x[k];
    }
    float m = x[0];
#pragma unroll
    for (int k = 1; k < kMore; ++k) m = fmaxf(m, x[k]);
    const float base = safe_base(m);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kMore; ++k)
      if ((k + 1) * group < nedge) s += exp2_approx((x[k] - base) * kLog2e);  // -inf adds exp(-inf) = 0
    st = {m, s};
  }
  auto fold_edge = [&] {
    const float x = E::value(edge);
    if (lane == t_edge) x_t = x;
    st = lse_merge(st, {x, 1.f});  // exp(x - x) = 1; for x = -inf it adds 0, NaN and +inf give NaN
  };

  const uint4* body = reinterpret_cast<const uint4*>(seg + head) - lead;
  const int group_shift = __ffs(group) - 1;  // group is a power of two
  const uint4 neg_inf = make_uint4(E::kNegInfWord, E::kNegInfWord, E::kNegInfWord, E::kNegInfWord);
  uint4 buf[kBatch];
  int v0 = lane;
  // A last batch of at most kShortTail vectors a lane (half a batch) costs the group a whole round trip
  // for a few bytes, after its other batches are done. Its vectors ride along with the batch before
  // it instead, into shared memory (cp.async holds no registers while in flight), and the last batch
  // reads them from there: 6450 x 10400 fp32 (evict-first) took 100.6 us against 110.9, 2000 x 20000
  // bf16 38.6 against 41.7 (read: 99.7, 38.7). Up to 2 or 3 vectors a lane gained less where the
  // tails are longer; 6 spill. An L2 prefetch of the tail instead still paid a round trip, to L2, and
  // gained about half as much (bench/PERF.md).
  const int batch_vecs = kBatch << group_shift;
  // The last batch's first vector. A later batch lies past the lead: lead < batch_vecs, as a lone
  // thread (batch_vecs = kBatch) has no lead.
  const int tail_batch = (end - 1) & -batch_vecs;
  const bool short_tail = tail_batch > 0 && end - tail_batch <= kShortTail * group;
  const int copy_with = short_tail ? tail_batch - batch_vecs : -1;
  auto copy_short_tail = [&](int batch) {
    if (batch != copy_with) return;
#pragma unroll
    for (int u = 0; u < kShortTail; ++u) {
      const int v = tail_batch + lane + u * group;
      if (v < end) copy_vec_async<kEvictFirst>(tail_slots + u * kThreads, body + v);
    }
  };
  // The target's vector, counted in this lane's vectors from the current batch on; negative (and
  // so, unsigned, out of range) in every other lane.
  int t_u = t_body && lane == t_lane ? (lead + t_vec) >> group_shift : -1;
  // A first batch that starts before the body (the vectors before it read as -inf, which adds
  // nothing), or that the edges wait for.
  if ((lead > 0 || nedge > 0) && v0 < end) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = v0 + u * group;
      buf[u] = neg_inf;  // the load writes under a predicate: a select after it would wait for it
      if (v >= lead && v < end) buf[u] = load_vec<kEvictFirst>(body + v);
    }
    copy_short_tail(0);
    if (nedge > 0) fold_edge();
    if (unsigned(t_u) < unsigned(kBatch)) x_t = E::at(vector_at(buf, t_u), t_elem);
    st = lse_add_batch<E>(st, buf);
    v0 += kBatch * group;
    t_u -= kBatch;
  } else if (nedge > 0) {
    fold_edge();
  }
  // Batches full in every lane of the warp (of the group, where it is smaller): no bounds checks, so
  // no predicate per load. A batch full in some of its lanes only goes to the partial path in all
  // of them: split by lane, a warp ran the two paths one after the other, two round trips for one
  // batch (8830 x 7600 fp32: 125.5 us against 99.3, 9320 x 14400 bf16 144.5 against 105.8). Whole
  // warps keep the unpredicated path: the group's partial batch in every warp cost 4096 x 32000
  // bf16 0.5-1.2 us (bench/PERF.md).
  const int warp_last = lane | (min(group, 32) - 1);  // the warp's last lane in the group
  for (; v0 - lane + warp_last + (kBatch - 1) * group < end; v0 += kBatch * group, t_u -= kBatch) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) buf[u] = load_vec<kEvictFirst>(body + v0 + u * group);
    copy_short_tail(v0 - lane);
    if (unsigned(t_u) < unsigned(kBatch)) x_t = E::at(vector_at(buf, t_u), t_elem);
    st = lse_add_batch<E>(st, buf);
  }
  // The last batch, partial in some lane of the warp: missing vectors read as -inf, which adds nothing.
  if (v0 < end) {
    const int nvalid = (end - v0 + group - 1) >> group_shift;  // this lane's vectors in the batch
    if (short_tail) {
      wait_copies();
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int v = v0 + u * group;
        buf[u] = u < kShortTail && v < end ? tail_slots[u * kThreads] : neg_inf;
      }
    } else {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) buf[u] = u < nvalid ? load_vec<kEvictFirst>(body + v0 + u * group) : neg_inf;
    }
    if (unsigned(t_u) < unsigned(kBatch)) x_t = E::at(vector_at(buf, t_u), t_elem);
    st = lse_add_batch<E>(st, buf, nvalid);
  }
  return st;
}

// ------------------------------------------------------------------ short rows: tiles in shared memory
// Rows of a few KB give a group one or two batches each, and a thread waits a whole round trip
// per row with nothing else in flight. Such rows are read instead as tiles: `tile_rows`
// neighbouring rows lie in one stretch of memory, which the whole CTA loads with 16-byte vectors
// (kBatch per thread, 32 KB) into registers, then stores to shared memory, where groups reduce
// the rows. The next tile's loads are issued before the rows of this one are reduced, so each
// CTA keeps a tile in flight all the time; the target logit comes from shared memory too. Rows of
// fewer than 4 vectors (kShortRowElems) are reduced element by element, or two elements a load
// where every row starts on a pair's boundary, in kernels of their own (tile_row_lse). (cp.async
// into two stages of shared memory instead, which frees those registers and keeps up to two tiles
// in flight, measured slower: bench/PERF.md.)
constexpr int kTileVecs = kThreads * kBatch;         // whole vectors a tile's stretch may hold
constexpr int kTileRows = kThreads * kTileTargets;   // rows a tile may hold
constexpr int kTargetIgnored = -1, kTargetBad = -2;  // targets as stored in shared memory (tiles, the segment merge)

// A tile's rows and the memory that holds them: row0's first element and the stretch up to the
// last row's last element, cut at 16-byte boundaries.
template <class E>
struct TileSpan {
  long long row0;
  int rows;
  const typename E::Storage* first;
  Aligned cut;
  int nedge;  // elements outside the whole vectors: fewer than 2 * kPerVec
};

template <class E>
__device__ __forceinline__ TileSpan<E> tile_span(const Params& p, long long tile) {
  TileSpan<E> t;
  t.row0 = tile * p.tile_rows;
  t.rows = int(min((long long)p.tile_rows, p.rows - t.row0));
  t.first = static_cast<const typename E::Storage*>(p.logits) + t.row0 * p.row_stride;
  const int len = int((t.rows - 1) * p.row_stride + p.cols);
  t.cut = align_stretch<E>(t.first, len);
  t.nedge = len - t.cut.nvec * E::kPerVec;
  return t;
}

// In shared memory, element e of the stretch sits at index kPerVec - head + e: its vectors fill
// slots 1 to nvec, and the ends fall in slot 0 and slot nvec + 1.
template <class E>
__device__ __forceinline__ int tile_index(const TileSpan<E>& t, int e) { return E::kPerVec - t.cut.head + e; }

// Whether a row counts (kTargetCounted), is skipped (ignore_index) or yields NaN (outside [0, cols)).
constexpr int kTargetCounted = 0;
__device__ __forceinline__ int target_kind(long long target, long long cols) {
  return target == kIgnoreIndex ? kTargetIgnored : (target >= 0 && target < cols) ? kTargetCounted : kTargetBad;
}
// A tile's target as stored in shared memory: its column where the row counts, else its kind.
__device__ __forceinline__ int target_code(long long target, long long cols) {
  const int kind = target_kind(target, cols);
  return kind == kTargetCounted ? int(target) : kind;
}

// A row's target as two 32-bit words, for int64 and int32 targets alike: a kernel that reads them
// so needs no instance per target type (a cold build's time), and no select between two loads in
// flight, which would wait for them on the spot. For int32 both words are the target.
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

// A 16-byte store to a shared-memory address held in one 32-bit register: through a generic
// pointer the compiler rebuilt the shared window's address before each predicated store.
__device__ __forceinline__ void store_shared(uint32_t address, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// One tile on its way from global memory: thread i holds vectors i, i + kThreads, ..., at most one
// edge element, and the targets of rows i, i + kThreads, ...
template <class E, class Target, bool kEvictFirst>
struct TileLoads {
  uint4 vec[kBatch];
  typename E::Storage edge;
  Target target[kTileTargets];

  __device__ __forceinline__ void issue(const Params& p, const TileSpan<E>& t) {
    const uint4* body = reinterpret_cast<const uint4*>(t.first + t.cut.head);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (threadIdx.x + u * kThreads < t.cut.nvec) vec[u] = load_vec<kEvictFirst>(body + threadIdx.x + u * kThreads);
    if (threadIdx.x < t.nedge) edge = t.first[edge_element<E>(t.cut, threadIdx.x)];
    const Target* targets = static_cast<const Target*>(p.targets);
#pragma unroll
    for (int k = 0; k < kTileTargets; ++k)
      if (threadIdx.x + k * kThreads < t.rows) target[k] = targets[(t.row0 + threadIdx.x + k * kThreads) * p.target_stride];
  }

  // Waits for the loads. The caller makes sure no thread still reads the previous tile.
  __device__ __forceinline__ void store(const Params& p, const TileSpan<E>& t, uint4* vecs, int* targets) const {
    uint32_t slot = static_cast<uint32_t>(__cvta_generic_to_shared(vecs + 1 + threadIdx.x));
    asm("" : "+r"(slot));  // kept in its register: rebuilt per store otherwise (see store_shared)
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (threadIdx.x + u * kThreads < t.cut.nvec) store_shared(slot + u * kThreads * sizeof(uint4), vec[u]);
    if (threadIdx.x < t.nedge)
      reinterpret_cast<typename E::Storage*>(vecs)[tile_index(t, edge_element<E>(t.cut, threadIdx.x))] = edge;
#pragma unroll
    for (int k = 0; k < kTileTargets; ++k)
      if (threadIdx.x + k * kThreads < t.rows) targets[threadIdx.x + k * kThreads] = target_code(target[k], p.cols);
  }
};

// Rows shorter than this many elements (4 vectors) are reduced element by element or in pairs, in
// kernels of their own (short_row_sweeps, short_row_pair_sweeps).
template <class E>
constexpr int kShortRowElems = 4 * E::kPerVec;

// A row in shared memory, reduced by its group in two sweeps: the max first, agreed on by the
// group, then the sum of exp against that one base. Reading the row twice from shared memory costs
// less than rescaling a running sum batch by batch, and holds no batch in registers while the
// next tile's loads do. The row is elements [start, start + len) of the tile, whose slot 0 is
// 16-byte aligned, so the row's cut at 16-byte boundaries follows from start alone. Rows of
// kShortRowElems elements or more (shorter ones: tile_row_lse). Every lane of the warp must
// call it (len 0 for rows it skips).
template <class E>
__device__ __forceinline__ Lse row_lse_shared(const uint4* tile, int start, int len, int lane, int group) {
  const auto* elems = reinterpret_cast<const typename E::Storage*>(tile);
  // len is 0 (a row it skips, with no head either) or at least kShortRowElems.
  const int head = len < kShortRowElems<E> ? len : (-start) & (E::kPerVec - 1);
  const Aligned cut = {head, (len - head) / E::kPerVec};
  const uint4* const body = tile + unsigned(start + head) / E::kPerVec;
  const uint4* const end = body + cut.nvec;
  const int nedge = len - cut.nvec * E::kPerVec;
  auto edge = [&](int k) { return E::value(elems[start + edge_element<E>(cut, k)]); };

  uint32_t mx = E::kNegInfWord;
  for (const uint4* v = body + lane; v < end; v += group) {
    const uint4 q = *v;
    mx = E::max2(mx, E::max2(E::max2(q.x, q.y), E::max2(q.z, q.w)));
  }
  float m = E::word_max(mx);
  for (int k = lane; k < nedge; k += group) m = fmaxf(m, edge(k));
  m = lanes_max(m, group);

  const float base = safe_base(m);
  float s = sum_exp(base, [&](auto exponent) {
    float s0 = 0.f, s1 = 0.f;
    for (const uint4* v = body + lane; v < end; v += group) {
      const uint4 q = *v;
#pragma unroll
      for (int i = 0; i < E::kPerVec; i += 2) {
        s0 += exp2_approx(exponent(E::at(q, i)));
        s1 += exp2_approx(exponent(E::at(q, i + 1)));
      }
    }
    for (int k = lane; k < nedge; k += group) s0 += exp2_approx(exponent(edge(k)));
    return s0 + s1;
  });
  return {m, lanes_sum(s, group)};
}

// Rows of fewer than kShortRowElems elements, element by element in the same two sweeps: cutting
// them at 16-byte boundaries costs more than it saves. The sweeps are unrolled so that a lane's
// loads from shared memory go out together: rolled, with the edge bookkeeping of row_lse_shared,
// each element cost 22 instructions, and 1000000 x 10 bf16 issued 450 warp instructions per 32
// rows, busy 66% of its cycles (ncu). kStride: 1 where each thread takes whole rows (group 1, which
// _plan gives tiles of many rows), so that the unrolled loop's trip count is len itself; 0 for a
// group's lanes at a stride of `group`, known only at run time, whose trip count costs an integer
// division per sweep (a row a thread that way: 1000000 x 10 bf16 took 27.1 us against 23.8).
template <class E, int kStride>
__device__ __forceinline__ Lse short_row_sweeps(const typename E::Storage* row, int len, int lane, int group) {
  const int first = kStride ? 0 : lane, stride = kStride ? kStride : group;
  float m = -INFINITY;
#pragma unroll 4
  for (int k = first; k < len; k += stride) m = fmaxf(m, E::value(row[k]));
  m = lanes_max(m, stride);
  const float base = safe_base(m);
  const float s = sum_exp(base, [&](auto exponent) {
    float s0 = 0.f;
#pragma unroll 4
    for (int k = first; k < len; k += stride) s0 += exp2_approx(exponent(E::value(row[k])));
    return s0;
  });
  return {m, lanes_sum(s, stride)};
}

// Rows of fewer than kShortRowElems elements, a thread each, that start on a pair's boundary and
// hold an even number of elements (pair_rows): the same two sweeps over pairs (the format's Pair),
// so that one load from shared memory brings two elements, and in 16-bit formats the max sweep runs
// on the packed pairs (max.bf16x2, max.f16x2). Float32 rows of an even width are also spared the
// bank conflicts of 4-byte loads: rows 10 words apart put two lanes of a warp on each bank. Where
// rows may start on either parity, the elements at either end cost more bookkeeping than the pairs
// saved at 10 columns (bench/PERF.md, session 18); here there are none, and kernels of their own
// keep the other short rows' code as it was (in one kernel, rows of 3 and 31 columns lost 0.4 us).
template <class E>
__device__ __forceinline__ Lse short_row_pair_sweeps(const typename E::Storage* row, int len) {
  using Pair = typename E::Pair;
  const Pair* pairs = reinterpret_cast<const Pair*>(row);
  const int n = len >> 1;
  Pair mx = E::neg_inf_pair();
#pragma unroll 4
  for (int k = 0; k < n; ++k) mx = E::pair_max(mx, pairs[k]);
  const float m = E::word_max(mx);
  const float base = safe_base(m);
  const float s = sum_exp(base, [&](auto exponent) {
    float s0 = 0.f, s1 = 0.f;
#pragma unroll 4
    for (int k = 0; k < n; ++k) {
      const Pair w = pairs[k];
      s0 += exp2_approx(exponent(E::low(w)));
      s1 += exp2_approx(exponent(E::high(w)));
    }
    return s0 + s1;
  });
  return {m, s};
}

// How a tile's rows are reduced, a kernel each: rows of kShortRowElems elements or more cut at
// 16-byte boundaries (row_lse_shared), shorter ones element by element (short_row_sweeps, at a
// stride of 1 where a thread takes whole rows), or in pairs (short_row_pair_sweeps).
constexpr int kVectorSweeps = 0, kElementSweeps = 1, kPairSweeps = 2;

// The (m, s) of the row at elements [start, start + len) of the tile. Every lane of the warp must
// call it (len 0 for rows it skips).
template <class E, int kSweeps>
__device__ __forceinline__ Lse tile_row_lse(const uint4* vecs, int start, int len, int lane, int group) {
  const auto* row = reinterpret_cast<const typename E::Storage*>(vecs) + start;
  if constexpr (kSweeps == kPairSweeps) return short_row_pair_sweeps<E>(row, len);
  else if constexpr (kSweeps == kElementSweeps)
    return group == 1 ? short_row_sweeps<E, 1>(row, len, lane, group) : short_row_sweeps<E, 0>(row, len, lane, group);
  else return row_lse_shared<E>(vecs, start, len, lane, group);
}

// The rows of a tile in shared memory, a row per group at a time; leaders add their rows' losses
// and count those of ignore_index. kSweeps: how each row is reduced (tile_row_lse).
template <class E, int kSweeps>
__device__ __forceinline__ void tile_loss(const Params& p, const TileSpan<E>& t, const uint4* vecs, const int* targets,
                                          int lane, int group, float& loss_sum, unsigned int& ignored) {
  const auto* elems = reinterpret_cast<const typename E::Storage*>(vecs);
  // group is a power of two: shifts, where divisions cost three conversions each.
  const int shift = __ffs(group) - 1;
  const int groups = kThreads >> shift;
  // The same trip count in every thread, so the group's shuffles never diverge.
  const int sweeps = (t.rows + groups - 1) >> (__ffs(kThreads) - 1 - shift);
  for (int k = 0; k < sweeps; ++k) {
    const int r = k * groups + (int(threadIdx.x) >> shift);
    const int target = r < t.rows ? targets[r] : kTargetIgnored;
    const int start = tile_index(t, r * int(p.row_stride));
    // Ignored rows and bad targets need no sum: they read nothing.
    const int len = target >= 0 ? int(p.cols) : 0;
    const Lse st = tile_row_lse<E, kSweeps>(vecs, start, len, lane, group);
    if (lane == 0 && r < t.rows) {
      if (target == kTargetIgnored) ++ignored;
      else loss_sum += target >= 0 ? row_loss(st, E::value(elems[start + target])) : __int_as_float(0x7fc00000);
    }
  }
}

// ------------------------------------------------------------------ the exact sum
// Whole rows: each chunk's loss sum, a float, is added to one fixed-point number by integer atomics.
// A finite float is mant * 2^(at - 149) with mant < 2^24 and 0 <= at <= 253, so its bits fall in
// two neighbouring 32-bit digits of a number whose unit is 2^-149: digit k weighs 2^(32k - 149),
// and kExactDigits of them reach 2^139, past the largest float. Each digit lives in a 64-bit word
// whose upper half takes the carries of up to 2^31 additions, one per chunk (chunks are far fewer:
// each holds 16 KB of logits or 8 rows, or there is one per CTA); a negative addend, a loss rounded
// just under zero, goes in as two's complement. The last CTA propagates the carries. Integer addition
// gives the same bits in any order, so the chunks may land in any order, no one sums per-chunk
// partials at the end, and the sum is exact until it is converted to double. (Before, the last
// CTA summed a float per chunk in index order: 4.7 us of 187 at 32768 x 4096 fp32, and blocks of
// chunks summed during the stream still cost 1-2 us; bench/PERF.md, session 13.) Infinities and
// NaN set flags in the word after the digits, so that the mean follows IEEE rules for them.
constexpr int kExactWords = CE_EXACT_WORDS;     // the digits, then the flags; the host's workspace layout
constexpr int kExactDigits = kExactWords - 1;
static_assert(32 * kExactDigits >= 253 + 24 && kExactWords % 2 == 0, "every float's bits, in whole 16-byte loads");
constexpr unsigned long long kSawNaN = 1, kSawPosInf = 2, kSawNegInf = 4;

// Relaxed atomics without a return (RED): the merging lane never waits for them. The last CTA sees
// them through the arrivals' release and acquire, as it would see stores.
__device__ __forceinline__ void exact_add(unsigned long long* acc, float v) {
  const uint32_t bits = __float_as_uint(v), biased = bits >> 23 & 0xffu, frac = bits & 0x7fffffu;
  if (biased == 0xffu) {
    atomicOr(acc + kExactDigits, frac ? kSawNaN : bits >> 31 ? kSawNegInf : kSawPosInf);
    return;
  }
  const int at = max(int(biased), 1) - 1;  // subnormals share the smallest normal's unit
  const unsigned long long x = (unsigned long long)(biased ? frac | 0x800000u : frac) << (at & 31);
  const unsigned long long lo = x & 0xffffffffull, hi = x >> 32, sign = bits >> 31;
  if (lo) atomicAdd(acc + (at >> 5), sign ? 0ull - lo : lo);
  if (hi) atomicAdd(acc + (at >> 5) + 1, sign ? 0ull - hi : hi);
}

__device__ __forceinline__ double pow2(int e) { return __longlong_as_double((long long)(e + 1023) << 52); }

// The sum as a double, read by one thread once every addition is visible to it; the accumulator is
// left at zero for the next launch.
__device__ __forceinline__ double exact_sum(unsigned long long* acc) {
  ulonglong2* const pairs = reinterpret_cast<ulonglong2*>(acc);
  unsigned long long w[kExactWords];
#pragma unroll
  for (int u = 0; u < kExactWords / 2; ++u) {
    const ulonglong2 q = __ldcg(pairs + u);
    w[2 * u] = q.x;
    w[2 * u + 1] = q.y;
  }
#pragma unroll
  for (int u = 0; u < kExactWords / 2; ++u) pairs[u] = make_ulonglong2(0ull, 0ull);
  // Carries up: digits in [0, 2^32), the sign in what is left above the top one.
  uint32_t digit[kExactDigits];
  long long top = 0;
#pragma unroll
  for (int k = 0; k < kExactDigits; ++k) {
    const long long v = (long long)w[k] + top;
    digit[k] = uint32_t(v);
    top = v >> 32;
  }
  const bool negative = top < 0;
  if (negative) {  // the magnitude: the two's complement of all the digits and the top
    unsigned long long carry = 1;
#pragma unroll
    for (int k = 0; k < kExactDigits; ++k) {
      const unsigned long long v = (unsigned long long)~digit[k] + carry;
      digit[k] = uint32_t(v);
      carry = v >> 32;
    }
    top = ~top + (long long)carry;
  }
  // From the top digit down, so that each addition rounds at most where the double's bits end.
  double sum = double(top) * pow2(32 * kExactDigits - 149);
#pragma unroll
  for (int k = kExactDigits - 1; k >= 0; --k) sum += double(digit[k]) * pow2(32 * k - 149);
  const unsigned long long flags = w[kExactDigits];
  if (flags & kSawNaN || (flags & kSawPosInf && flags & kSawNegInf)) return __int_as_float(0x7fc00000);  // inf - inf too
  if (flags) return flags & kSawPosInf ? INFINITY : -INFINITY;
  return negative ? -sum : sum;
}

// ------------------------------------------------------------------ the end of a launch
// Rows of ignore_index, counted by warp (an integer sum, the same in any order), then this CTA's
// arrival. Returns whether it is the last CTA to arrive; every CTA has made its last claim by then,
// and the caller resets the claims' counter in that case (made here, the reset cost the tiled kernel
// a spill on sm_80). Every thread must call it.
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

// The last CTA's share of whole rows, in thread 0: the chunks' exact sum and the rows counted.
__device__ __forceinline__ Total whole_rows_total(const Params& p) {
  if (threadIdx.x != 0) return {0.0, 0ull};
  const unsigned long long ignored_rows = __ldcg(p.ignored_rows);  // before the sum's loads: one round trip
  return {exact_sum(p.exact), p.rows - ignored_rows};
}

// The last CTA's share of split rows: each row's segments merged, its loss, and the rows counted.
template <class E, class Target>
__device__ Total segments_total(const Params& p) {
  // Launched with it only where rows are split: the last CTA's segment partials, a slab of rows at a
  // time, then those rows' target_kind. Dynamic, so that the other launches keep their few hundred
  // bytes of shared memory, and L1 the rest.
  extern __shared__ float4 seg_slab[];
  int* const seg_kinds = reinterpret_cast<int*>(seg_slab + kSegSlab);
  const Target* targets = static_cast<const Target*>(p.targets);
  Total total = {0.0, 0ull};
  // Segments: a slab of rows' (m, s, x_t) triples and their targets come into shared memory in one
  // round of loads, then `lanes` threads merge each row: lane l takes segments l, l + lanes, ... in
  // order (at most 4 where 32 lanes allow), and a butterfly merges the lanes. One thread per row,
  // merging straight from global memory, waited a round trip per segment, then merged them one by
  // one: 1 x 4096000 fp32 took 46 us. A warp per row wasted lanes on rows of a few segments.
  constexpr int kPerThread = kSegSlab / kThreads;
  const int slab_rows = kSegSlab / p.splits;  // at most kThreads: the host keeps 2 <= splits <= kSegSlab
  int lanes = 1;
  while (lanes < 32 && 4 * lanes < p.splits) lanes <<= 1;
  const int row_lane = threadIdx.x & (lanes - 1), row_groups = kThreads / lanes;
  for (long long r0 = 0; r0 < p.rows; r0 += slab_rows) {
    const int nrows = int(min((long long)slab_rows, p.rows - r0));
    const int n = nrows * p.splits;
    const float4* src = p.seg_partials + r0 * p.splits;
    float4 q[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u)
      if (threadIdx.x + u * kThreads < n) q[u] = __ldcg(src + threadIdx.x + u * kThreads);
    // The kind alone: the target logit is in the partials, and the column can pass 2^31 here.
    if (int(threadIdx.x) < nrows) seg_kinds[threadIdx.x] = target_kind(targets[(r0 + threadIdx.x) * p.target_stride], p.cols);
#pragma unroll
    for (int u = 0; u < kPerThread; ++u)
      if (threadIdx.x + u * kThreads < n) seg_slab[threadIdx.x + u * kThreads] = q[u];
    __syncthreads();
    // The same trip count in every thread, so that the butterflies never diverge.
    const int sweeps = (nrows + row_groups - 1) / row_groups;
    for (int k = 0; k < sweeps; ++k) {
      const int r = k * row_groups + int(threadIdx.x) / lanes;
      Lse st = {-INFINITY, 0.f};
      float x_target = 0.f;
      for (int s = row_lane; r < nrows && s < p.splits; s += lanes) {
        const float4 part = seg_slab[r * p.splits + s];
        st = lse_merge(st, {part.x, part.y});
        x_target += part.z;  // one segment holds the target logit, the rest +0
      }
      lse_reduce_lanes(st, lanes);
      x_target = lanes_sum(x_target, lanes);
      const int kind = r < nrows ? seg_kinds[r] : kTargetIgnored;
      if (row_lane == 0 && kind != kTargetIgnored) {
        total.sum += kind == kTargetCounted ? row_loss(st, x_target) : __int_as_float(0x7fc00000);
        ++total.count;
      }
    }
    __syncthreads();  // every row is merged before the next slab overwrites this one
  }
  return total;
}

// The mean from the CTA's total, in thread 0, which also leaves the ignored rows' count at zero for
// the next launch.
template <class E>
__device__ __forceinline__ void store_mean(const Params& p, Total total) {
  if (threadIdx.x == 0) {
    *p.ignored_rows = 0;
    E::store(p.out, float(total.sum / double(total.count)));  // 0 rows: 0/0 = NaN
  }
}

// ------------------------------------------------------------------ the kernel
// kTiled: a chunk is a tile of whole short rows, staged through shared memory; otherwise rows
// (or segments) stream through registers, a group per item. kSweeps (tiles only): how each row is
// reduced (tile_row_lse); kernels of their own, because with both the vector and the element sweeps
// in one kernel the tiles of longer rows ran 0.4-0.9 us slower (65536 x 1000 bf16, 262144 x 250
// bf16, 200000 x 200 fp32). kEvictFirst: the loads of the logits (see load_vec). kLead256 (rows in
// registers): whether rows may be counted from the 256-byte grid (reduce_segment). Target: the
// targets' type, int64 or int32; read as TargetWords instead, as the row-batch kernel does, with
// half the instances, the shortest 16-bit rows ran 1.5-3% slower (1000000 x 10, 4000000 x 6).
template <class E, class Target, bool kTiled, int kSweeps, bool kEvictFirst, bool kLead256 = true>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) cross_entropy_mean_kernel(const Params p) {
  __shared__ float4 warp_state[2][kWarps];     // (m, s, target logit or 0, unused) per warp, by item parity
  __shared__ float warp_sums[2][kWarps];       // loss sum per warp, by chunk parity
  __shared__ long long claimed[2];             // the chunk after next, by chunk parity
  __shared__ Total final_scratch[kWarps];
  __shared__ uint4 tile_vecs[kTiled ? kTileVecs + 2 : 1];  // a tile's vectors, a spare slot at each end
  __shared__ int tile_targets[kTiled ? kTileRows : 1];
  __shared__ uint4 tail_vecs[kTiled ? 1 : kShortTail * kThreads];  // a short last batch: thread t's u-th vector at u * kThreads + t

  const int group = p.group;
  const int lane = threadIdx.x & (group - 1);
  // group is a power of two: shifts, where a division took some 20 instructions ahead of the first load.
  const int group_shift = __ffs(group) - 1;
  const int group_id = threadIdx.x >> group_shift;
  const int groups = kThreads >> group_shift;
  const int rounds = p.chunk_rounds;
  const bool leader = lane == 0;
  const bool whole_rows = kTiled || p.splits == 1;  // else segments, with a partial per item
  const Target* targets = static_cast<const Target*>(p.targets);
  const auto* logits = static_cast<const typename E::Storage*>(p.logits);
  unsigned int* const claims = p.counter + 1;

  // Round r of chunk c gives group g the item (r * chunks + c) * groups + g: a CTA reads `groups`
  // neighbouring items at a time, and CTAs at the same round read neighbouring stretches, so the
  // grid sweeps the tensor front to back. Targets are loaded one item ahead, so a row's stream
  // never waits on its target's load; the claim for the chunk after next is made a whole chunk
  // before it is needed.
  auto item_of = [&](long long chunk, int r) { return (r * p.chunks + chunk) * groups + group_id; };
  auto row_of = [&](long long item) { return p.splits == 1 ? item : item / p.splits; };
  auto load_target = [&](long long item) {
    return item < p.items ? (long long)targets[row_of(item) * p.target_stride] : kIgnoreIndex;
  };
  long long chunk = blockIdx.x, next_chunk = (long long)gridDim.x + blockIdx.x;
  long long next_target = kTiled ? 0 : load_target(item_of(chunk, 0));
  TileLoads<E, Target, kEvictFirst> tile;  // tiles: the next one, in flight
  if (kTiled && chunk < p.chunks) tile.issue(p, tile_span<E>(p, chunk));
  unsigned int ignored = 0;  // leaders: the rows of ignore_index they met; the mean divides by the rest
  int item_parity = 0;

  for (int parity = 0; chunk < p.chunks; parity ^= 1) {  // chunk is the same in every thread
    unsigned int claim = 0;
    if (threadIdx.x == 0) claim = atomicAdd(claims, 1u);
    float loss_sum = 0.f;  // leaders: this group's rows of the chunk, in order; 0 elsewhere

    if constexpr (kTiled) {
      // The last chunk's barrier below is past every read of the previous tile.
      const TileSpan<E> span = tile_span<E>(p, chunk);
      tile.store(p, span, tile_vecs, tile_targets);
      if (next_chunk < p.chunks) tile.issue(p, tile_span<E>(p, next_chunk));
      __syncthreads();
      tile_loss<E, kSweeps>(p, span, tile_vecs, tile_targets, lane, group, loss_sum, ignored);
    }
    for (int r = 0; !kTiled && r < rounds; ++r, item_parity ^= 1) {
      const long long item = item_of(chunk, r);
      const long long target = next_target;
      next_target = load_target(r + 1 < rounds ? item_of(chunk, r + 1) : item_of(next_chunk, 0));
      Lse st = {-INFINITY, 0.f};
      float x_target = 0.f;  // in the lane that read it; stays 0 in segments without the target column
      int t_lane = 0;
      // Ignored and out-of-range targets need no logits: the row is skipped or yields NaN.
      if (item < p.items && target >= 0 && target < p.cols) {
        const long long row = row_of(item);
        const long long c0 = (item - row * p.splits) * (long long)p.seg_len;
        const auto* seg = logits + row * p.row_stride + c0;
        const int len = int(min((long long)p.seg_len, p.cols - c0));
        const int tcol = target >= c0 && target < c0 + len ? int(target - c0) : -1;
        st = reduce_segment<E, kEvictFirst, kLead256>(seg, len, lane, group, tcol, tail_vecs + threadIdx.x, x_target, t_lane);
      }

      // The group's merged state and target logit, complete in its leader.
      if (group <= 32) {
        lse_reduce_lanes(st, group);
        x_target = __shfl_sync(0xffffffffu, x_target, t_lane, group);
      } else {
        lse_reduce_lanes(st, 32);
        // Each warp takes the value at the target's lane: 0 except in the warp that read it.
        x_target = __shfl_sync(0xffffffffu, x_target, t_lane & 31);
        const int warp = threadIdx.x >> 5, warps_per_group = group >> 5;
        if ((threadIdx.x & 31) == 0) warp_state[item_parity][warp] = make_float4(st.m, st.s, x_target, 0.f);
        group_barrier(1 + group_id, group);
        // The group's first warp merges the warps' states, lane w taking warp w's: a butterfly of
        // log2(warps) levels, where the leader merging them one after another waited on each exp.
        if (lane < 32) {
          const int w = threadIdx.x & 31;
          const float4 o = w < warps_per_group ? warp_state[item_parity][warp + w] : make_float4(-INFINITY, 0.f, 0.f, 0.f);
          st = {o.x, o.y};
          lse_reduce_lanes(st, warps_per_group);
          x_target = lanes_sum(o.z, warps_per_group);  // one warp's is the target logit, the rest +0
        }
      }

      if (leader && item < p.items) {
        if (!whole_rows) {
          p.seg_partials[item] = make_float4(st.m, st.s, x_target, 0.f);
        } else if (target == kIgnoreIndex) {
          ++ignored;
        } else {
          loss_sum += (target >= 0 && target < p.cols) ? row_loss(st, x_target) : __int_as_float(0x7fc00000);
        }
      }
    }

    // The chunk's sum in a fixed order: each warp sums its leaders (every warp at once), then
    // thread 0 sums the warps. Only that last step waits for the barrier, so the chunk costs
    // the CTA one barrier and a few shared-memory reads.
    if (whole_rows) {
      for (int offset = group; offset < 32; offset <<= 1) loss_sum += __shfl_xor_sync(0xffffffffu, loss_sum, offset);
      if ((threadIdx.x & 31) == 0) warp_sums[parity][threadIdx.x >> 5] = loss_sum;
    }
    if (threadIdx.x == 0) claimed[parity] = 2ll * gridDim.x + claim;
    __syncthreads();
    if (whole_rows && threadIdx.x == 0) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += warp_sums[parity][w];
      exact_add(p.exact, sum);
    }
    chunk = next_chunk;
    next_chunk = claimed[parity];
  }

  if (!arrive_last(p, ignored, whole_rows)) return;
  if (threadIdx.x == 0) *claims = 0;
  store_mean<E>(p, whole_rows ? whole_rows_total(p) : cta_sum(segments_total<E, Target>(p), final_scratch));
}

// ------------------------------------------------------------------ rows that tile a CTA batch
// Where kBatchRows whole rows fill one batch of the CTA exactly (kThreads x kRowBatchLoads 16-byte
// vectors, 16 KB), a chunk is one such batch, and each row has kThreads / kBatchRows threads (whole
// warps) that hold kRowBatchLoads of its vectors each. The next chunk's loads go out before this
// one's rows are reduced, into a second set of registers, so every CTA keeps a batch in flight
// through its reductions; the two sets trade roles from one step to the next, never through a copy
// (a register copy of a load in flight waits for it). Each warp reduces its share of its row with
// butterflies and leaves (m, s) in shared memory, and the thread that holds the target logit leaves
// it beside them. After the chunk's one barrier a single warp, a different one each chunk, merges
// the rows and adds the chunk's loss sum to the exact sum, while the others stream on.
constexpr int kRowBatchLoads = CE_ROW_BATCH_LOADS;  // 16-byte loads per thread and batch
constexpr int kTargetPast = -3;    // a row of the last chunk past the last row

template <class E, int kBatchRows, bool kEvictFirst>
struct RowBatch {
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
    const long long target_class = target_value(p, target);  // ahead of the row test: the order ptxas scheduled as measured
    const int code = chunk * kBatchRows + r < p.rows ? target_code(target_class, p.cols) : kTargetPast;
    if (i == 0) codes[r] = code;
    if (code >= 0 && v % kRowThreads == uint32_t(i)) x_t[r] = E::at(vector_at(vec, v / kRowThreads), code % E::kPerVec);
  }
};

// One warp after the chunk's barrier: lane w takes warp w's (m, s), a butterfly merges each row's
// warps, and the rows' losses are summed in row order, then added to the exact sum.
template <int kBatchRows>
__device__ __forceinline__ void merge_batch_rows(const Params& p, const float2* state, const float* x_t, const int* codes,
                                                 unsigned int& ignored) {
  constexpr int kRowWarps = kWarps / kBatchRows;
  const int lane = threadIdx.x & 31, r = lane / kRowWarps;
  const float2 part = lane < kWarps ? state[lane] : make_float2(-INFINITY, 0.f);
  Lse st = {part.x, part.y};
  lse_reduce_lanes(st, kRowWarps);
  float loss = 0.f;
  if (lane % kRowWarps == 0 && r < kBatchRows) {
    const int code = codes[r];
    if (code == kTargetIgnored) ++ignored;
    else if (code != kTargetPast) loss = code >= 0 ? row_loss(st, x_t[r]) : __int_as_float(0x7fc00000);
  }
  for (int offset = kRowWarps; offset < kWarps; offset <<= 1) loss += __shfl_xor_sync(0xffffffffu, loss, offset);
  if (lane == 0) exact_add(p.exact, loss);
}

// Where a CTA stands in the stream of chunks.
struct ChunkCursor {
  long long chunk, next_chunk;  // the chunk this step reduces, and the one whose loads it issues
  int merger;                   // the warp that merges this chunk's rows
  unsigned int ignored;         // the merging lanes' rows of ignore_index
};

// One chunk: claim the chunk after next, issue the next one's loads, reduce this one's rows, and
// after the barrier merge them in one warp. A function, not a lambda, so that it is inlined at both
// of its calls and the batches stay in registers (as a lambda it kept them on the stack).
template <class Batch>
__device__ __forceinline__ void row_batch_step(const Params& p, const Batch& cur, Batch& next, int parity,
                                               ChunkCursor& at) {
  constexpr int kRows = Batch::kRows;
  __shared__ float2 state[2][kWarps];         // by chunk parity, as the rest
  __shared__ float target_logit[2][kRows];
  __shared__ int target_codes[2][kRows];
  __shared__ long long claimed[2];            // the chunk after next
  unsigned int claim = 0;
  if (threadIdx.x == 0) claim = atomicAdd(p.counter + 1, 1u);
  if (at.next_chunk < p.chunks) next.issue(p, at.next_chunk);
  cur.reduce(p, at.chunk, state[parity], target_logit[parity], target_codes[parity]);
  if (threadIdx.x == 0) claimed[parity] = 2ll * gridDim.x + claim;
  __syncthreads();
  if (int(threadIdx.x >> 5) == at.merger)
    merge_batch_rows<kRows>(p, state[parity], target_logit[parity], target_codes[parity], at.ignored);
  at.merger = (at.merger + 1) % kWarps;
  at.chunk = at.next_chunk;
  at.next_chunk = claimed[parity];
}

template <class E, int kBatchRows, bool kEvictFirst>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) cross_entropy_mean_row_batch_kernel(const Params p) {
  ChunkCursor at = {blockIdx.x, (long long)gridDim.x + blockIdx.x, 0, 0u};
  RowBatch<E, kBatchRows, kEvictFirst> a = {}, b = {};  // zeros: the last chunk's missing rows read them
  if (at.chunk < p.chunks) a.issue(p, at.chunk);
  while (at.chunk < p.chunks) {  // the same in every thread
    row_batch_step(p, a, b, 0, at);
    if (at.chunk >= p.chunks) break;
    row_batch_step(p, b, a, 1, at);
  }
  if (!arrive_last(p, at.ignored, true)) return;
  if (threadIdx.x == 0) p.counter[1] = 0;
  store_mean<E>(p, whole_rows_total(p));
}

// ------------------------------------------------------------------ one row
// A lone row (logits of shape (C,), or N = 1) of up to 128 KB is latency, not bandwidth: one
// CTA holds all of it in registers, one batch per thread, so the row costs one round trip, a few
// hundred instructions and one barrier. Through the general kernel a row of 16 KB waited for its
// target before its loads and ran some 600 instructions of setup per warp (items, claims), and one
// of 64-128 KB was split across CTAs whose partials a last CTA merged; both ended 1-3 us later
// (bench/PERF.md, session 15). Here the target's load and the row's go out together and nothing
// stands before them, and the mean of one row is its loss, so there is no sum to keep.
// blockDim.x threads (whole warps, a power of two) take the row's whole vectors threadIdx.x +
// u * blockDim.x, and the few elements outside them (align_stretch) one each.
constexpr int kOneRowThreads = CE_ONE_ROW_THREADS;

template <class E>
__global__ void __launch_bounds__(kOneRowThreads) cross_entropy_mean_one_row_kernel(const Params p) {
  __shared__ float2 warp_state[kOneRowThreads / 32];
  __shared__ float x_target;
  const TargetWords target = load_target_words(p, 0);
  const auto* row = static_cast<const typename E::Storage*>(p.logits);
  const int cols = int(p.cols);
  const Aligned cut = align_stretch<E>(row, cols);
  const uint4* body = reinterpret_cast<const uint4*>(row + cut.head);
  const uint4 neg_inf = make_uint4(E::kNegInfWord, E::kNegInfWord, E::kNegInfWord, E::kNegInfWord);
  uint4 vec[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    vec[u] = i < cut.nvec ? body[i] : neg_inf;  // -inf adds exp(-inf) = 0
  }
  const int nedge = cols - cut.nvec * E::kPerVec;  // at most 2 * (kPerVec - 1): fewer than 32
  const float edge = int(threadIdx.x) < nedge ? load_scalar<E>(row + edge_element<E>(cut, threadIdx.x)) : -INFINITY;

  const float m = lanes_max(fmaxf(vectors_max<E>(vec), edge), 32);
  const float base = safe_base(m);
  const float s = warp_sum(vectors_sum_exp<E>(vec, base, exp2_approx((edge - base) * kLog2e)));
  if ((threadIdx.x & 31) == 0) warp_state[threadIdx.x >> 5] = make_float2(m, s);

  // The thread that holds the target logit leaves it in shared memory.
  const int code = target_code(target_value(p, target), p.cols);
  const int c = code - cut.head;  // the target's place in the whole vectors
  if (code >= 0 && c >= 0 && c < cut.nvec * E::kPerVec) {
    const int shift = __ffs(blockDim.x) - 1, v = c / E::kPerVec;
    if ((v & (blockDim.x - 1)) == threadIdx.x) x_target = E::at(vector_at(vec, uint32_t(v >> shift)), c % E::kPerVec);
  } else if (code >= 0 && int(threadIdx.x) == edge_number<E>(cut, code)) {
    x_target = edge;
  }
  __syncthreads();

  if (threadIdx.x < 32) {
    const int w = threadIdx.x;
    const float2 part = w < int(blockDim.x >> 5) ? warp_state[w] : make_float2(-INFINITY, 0.f);
    Lse st = {part.x, part.y};
    lse_reduce_lanes(st, kOneRowThreads / 32);
    // An ignored target leaves no row to average (0 / 0), a bad one is NaN: both NaN, as in PyTorch.
    if (w == 0) E::store(p.out, code >= 0 ? row_loss(st, x_target) : __int_as_float(0x7fc00000));
  }
}

// Whether the pair sweeps may take a tile of short rows (short_row_pair_sweeps): rows a thread each
// (group 1), an even number of elements long and apart, from logits on a pair's boundary (4 bytes
// in 16-bit formats, 8 in float32). Every row then starts on one in shared memory too, where the
// tile's first element sits at its offset from the 16-byte grid (tile_index).
template <class E>
bool pair_rows(const Params& p) {
  return p.group == 1 && (p.cols | p.row_stride) % 2 == 0 &&
         reinterpret_cast<uintptr_t>(p.logits) % sizeof(typename E::Pair) == 0;
}

template <class E, class Target, bool kEvictFirst>
void launch_typed(const Params& p, int grid, cudaStream_t stream) {
  const size_t seg_smem = p.splits > 1 ? kSegSlab * sizeof(float4) + kThreads * sizeof(int) : 0;
  if (p.one_row) cross_entropy_mean_one_row_kernel<E><<<1, p.group, 0, stream>>>(p);
  else if (p.batch_rows == 1) cross_entropy_mean_row_batch_kernel<E, 1, kEvictFirst><<<grid, kThreads, 0, stream>>>(p);
  else if (p.batch_rows == 2) cross_entropy_mean_row_batch_kernel<E, 2, kEvictFirst><<<grid, kThreads, 0, stream>>>(p);
  else if (p.tile_rows == 0 && kEvictFirst && !p.lead_256)
    // Rows in registers that keep the 16-byte grid, in a kernel of their own: a lead known only at run
    // time cost them 0.5-1.5 us (groups of 32 and 64 threads, evict-first; bench/PERF.md).
    cross_entropy_mean_kernel<E, Target, false, kVectorSweeps, true, false><<<grid, kThreads, seg_smem, stream>>>(p);
  else if (p.tile_rows == 0) cross_entropy_mean_kernel<E, Target, false, kVectorSweeps, kEvictFirst><<<grid, kThreads, seg_smem, stream>>>(p);
  else if (p.cols >= kShortRowElems<E>) cross_entropy_mean_kernel<E, Target, true, kVectorSweeps, kEvictFirst><<<grid, kThreads, 0, stream>>>(p);
  else if (pair_rows<E>(p)) cross_entropy_mean_kernel<E, Target, true, kPairSweeps, kEvictFirst><<<grid, kThreads, 0, stream>>>(p);
  else cross_entropy_mean_kernel<E, Target, true, kElementSweeps, kEvictFirst><<<grid, kThreads, 0, stream>>>(p);
}

template <class E, class Target>
void launch_for_loads(const Params& p, bool evict_first, int grid, cudaStream_t stream) {
  if (evict_first) launch_typed<E, Target, true>(p, grid, stream);
  else launch_typed<E, Target, false>(p, grid, stream);
}

template <class E>
void launch_for_targets(const Params& p, int target_bytes, bool evict_first, int grid, cudaStream_t stream) {
  if (target_bytes == 8) launch_for_loads<E, long long>(p, evict_first, grid, stream);
  else launch_for_loads<E, int>(p, evict_first, grid, stream);
}

}  // namespace

// dtype: 0 float32, 1 bfloat16, 2 float16. Pointers and the stream come from Python as integers.
void launch_cross_entropy_mean(uintptr_t logits, uintptr_t targets, uintptr_t out, uintptr_t counter,
                               uintptr_t exact, uintptr_t seg_partials, int64_t rows, int64_t cols,
                               int64_t row_stride, int64_t target_stride, int64_t dtype, int64_t target_bytes,
                               int64_t splits, int64_t seg_len, int64_t group, int64_t chunk_rounds, int64_t chunks,
                               int64_t tile_rows, int64_t batch_rows, bool one_row, bool lead_256, bool evict_first, int64_t grid,
                               int64_t device, uintptr_t stream) {
  Params p;
  p.logits = reinterpret_cast<const void*>(logits);
  p.targets = reinterpret_cast<const void*>(targets);
  p.out = reinterpret_cast<void*>(out);
  p.counter = reinterpret_cast<unsigned int*>(counter);
  p.ignored_rows = reinterpret_cast<unsigned long long*>(counter + 8);
  p.exact = reinterpret_cast<unsigned long long*>(exact);
  p.seg_partials = reinterpret_cast<float4*>(seg_partials);
  p.rows = rows;
  p.cols = cols;
  p.row_stride = row_stride;
  p.target_stride = target_stride;
  p.items = rows * splits;
  p.chunks = chunks;
  p.chunk_rounds = int(chunk_rounds);
  p.splits = int(splits);
  p.seg_len = int(seg_len);
  p.group = int(group);
  p.tile_rows = int(tile_rows);
  p.batch_rows = int(batch_rows);
  p.one_row = one_row;
  p.lead_256 = lead_256;
  p.target_bytes = int(target_bytes);

  int previous = 0;
  cudaGetDevice(&previous);
  if (previous != device) cudaSetDevice(int(device));
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (dtype == 0) launch_for_targets<F32>(p, int(target_bytes), evict_first, int(grid), s);
  else if (dtype == 1) launch_for_targets<BF16>(p, int(target_bytes), evict_first, int(grid), s);
  else launch_for_targets<F16>(p, int(target_bytes), evict_first, int(grid), s);
  const cudaError_t err = cudaGetLastError();
  if (previous != device) cudaSetDevice(previous);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("cross-entropy kernel launch failed: ") + cudaGetErrorString(err));
}
"""

_CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <cstdint>

void launch_cross_entropy_mean(uintptr_t logits, uintptr_t targets, uintptr_t out, uintptr_t counter,
                               uintptr_t exact, uintptr_t seg_partials, int64_t rows, int64_t cols,
                               int64_t row_stride, int64_t target_stride, int64_t dtype, int64_t target_bytes,
                               int64_t splits, int64_t seg_len, int64_t group, int64_t chunk_rounds, int64_t chunks,
                               int64_t tile_rows, int64_t batch_rows, bool one_row, bool lead_256, bool evict_first, int64_t grid,
                               int64_t device, uintptr_t stream);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("launch", &launch_cross_entropy_mean, "Launch the fused cross-entropy-mean kernel (raw pointers).");
}
"""

# ---------------------------------------------------------------------------------------------
# Launch policy: the one place that decides the launch shape.
_THREADS = 256          # threads per CTA (the kernel's kThreads)
_CTAS_PER_SM = 3        # resident CTAs per SM (the kernel's launch bounds): 768 threads, 85 registers each
_BATCH = 8              # 16-byte loads each thread issues together (the kernel's kBatch)
_VECS_PER_THREAD = 16   # 16-byte vectors per thread and item (two batches), where rows are long enough;
                        # one batch (twice the group) where the loads are evict-first: see _plan
_MIN_SLOT_FILL = {_BATCH: 0.8, _VECS_PER_THREAD: 0.7}  # ... and half the group where a row fills less of them
_SHORT_TAIL = 4         # a row's last batch of at most this many vectors a thread rides along with the one before it
_EVICT_FIRST_LEAD_MIN_GROUP = 64  # evict-first rows counted from the 256-byte grid: only in groups this large (_lead_256)
_MAX_SEG = 1 << 30      # in-segment column indices are 32-bit
_SEG_SLAB = 2 * _THREADS  # segments per row at most: the last CTA stages a row's partials at once (kSegSlab)
_CLAIM_BYTES = 16 << 10 # a CTA's round reads at least this much: claim chunks of one round
_TILE_BYTES = _THREADS * _BATCH * 16  # a tile of short rows: one batch of every thread of a CTA
_TILE_TARGETS = 4       # targets per thread and tile (the kernel's kTileTargets)
_TILE_MIN_ROWS = 8      # rows shorter than an eighth of a tile are staged through shared memory
_EVICT_FIRST_L2S = 6    # logits of at most this many L2 sizes are read with evict-first loads
_EVICT_FIRST_TILE_CTAS = 2        # CTAs per SM for evict-first tiles of rows of ...
_EVICT_FIRST_TILE_MIN_ROW = 512   # ... at least this many bytes
_ROW_BATCH_LOADS = 4            # 16-byte loads per thread and batch of the row-batch kernel (kRowBatchLoads)
_ROW_BATCH_VECS = _THREADS * _ROW_BATCH_LOADS  # its CTA batch, in 16-byte vectors
_ROW_BATCH_MIN_CHUNKS = 4       # ... taken where every CTA gets at least this many batches
_ONE_ROW_THREADS = 1024         # the one-row kernel's most threads (kOneRowThreads), each with a batch of the row
_FAST_MEMORY_PER_SM = 30e9      # DRAM peak, bytes/s per SM, above which the row-batch kernel cannot keep up ...
_FAST_MEMORY_L2S = 3            # ... past this many L2 sizes of logits: see _fast_memory
_EXACT_WORDS = 10               # 64-bit words of the exact sum: 9 digits and the flags (the kernel's kExactWords)
_IGNORE_INDEX = -100


class _Plan(NamedTuple):
    grid: int    # CTAs
    group: int   # threads per item
    splits: int  # segments per row
    seg_len: int # columns per segment (a multiple of the vector width)
    rounds: int  # items per group in a chunk
    chunks: int  # work units the CTAs claim: `rounds` items per group of a CTA, or a tile
    tile_rows: int = 0  # short rows: rows per tile staged through shared memory; 0: rows in registers
    batch_rows: int = 0  # rows that fill a CTA batch exactly: rows per chunk (1 or 2); 0: another layout
    one_row: bool = False  # a lone row, one batch per thread at most: the one-row kernel on `group` threads
    lead_256: bool = False  # rows in registers: each row's vectors counted from the 256-byte grid (_lead_256)


def _pow2_at_least(x):
    return 1 << max(0, (int(x) - 1).bit_length())


def _tile_fit(rows, cols, row_stride, elem_bytes):
    """The most rows a shared-memory tile holds, or 0 where rows are too long to stage. A tile is
    the stretch from its first row's first element to its last row's last, gaps included, so rows
    further apart than a little over their length are not staged: the gaps would be read too."""
    span = _TILE_BYTES // elem_bytes
    stride = row_stride if rows > 1 else cols
    if cols > span or stride > cols + max(cols // 8, 32 // elem_bytes):
        return 0
    fit = min(_THREADS * _TILE_TARGETS, 1 + (span - cols) // stride if stride else span)
    return fit if fit >= _TILE_MIN_ROWS else 0


def _tile_rows(rows, fit, max_grid):
    """Rows per tile, at most `fit` (_tile_fit, nonzero), for a grid of max_grid CTAs."""
    per_cta = -(-rows // max_grid)
    if per_cta <= _THREADS or fit < _THREADS:
        # Smaller tiles where the rows would not fill every CTA with one tile each.
        return max(1, min(fit, per_cta))
    # Tiles of more rows than threads: a thread per row (the group _plan gives them), a row per
    # sweep. A tile of whole sweeps, as many as leave the busiest CTA fewest sweeps in all (its tiles
    # times their sweeps), the larger tile on a tie: a partial last sweep, or a last round of tiles
    # that few CTAs take, costs the time of a whole one. (The most rows that fit instead: 1000000 x
    # 10 fp32 in 31.7 us against 27.4, 819 rows a tile against 512; 500000 x 31 bf16 28.4 against
    # 23.3, 528 rows against 256; 2000000 x 24 fp32 86.3 against 83.1; bench/PERF.md, session 18.)
    def busiest(sweeps):
        tiles = -(-rows // (sweeps * _THREADS))
        return -(-tiles // max_grid) * sweeps
    return _THREADS * min(range(fit // _THREADS, 0, -1), key=busiest)


def _batch_rows(rows, cols, row_stride, elem_bytes, num_sms, aligned):
    """Rows per chunk for the row-batch kernel: 1 or 2 where that many rows of whole 16-byte
    vectors, each starting on the 16-byte grid, fill its CTA batch exactly and every CTA gets
    several batches; else 0. Measured against the other layouts (bench/PERF.md, session 12), with
    evict-first loads it read 32768 x 4096 bf16 in 97.8 us against 100.2, 8192 x 8192 bf16 in 53.0
    against 55.4, 4096 x 4096 fp32 in 30.8 against 33.0; with plain loads it tied (fp32 32768 x 4096)."""
    per_vec = 16 // elem_bytes
    if not aligned or cols % per_vec or row_stride % per_vec:
        return 0
    batch_rows = _ROW_BATCH_VECS // (cols // per_vec)
    if batch_rows not in (1, 2) or batch_rows * (cols // per_vec) != _ROW_BATCH_VECS:
        return 0
    if rows < batch_rows * _ROW_BATCH_MIN_CHUNKS * num_sms * _CTAS_PER_SM:
        return 0
    return batch_rows


def _plan(rows, cols, row_stride, elem_bytes, num_sms, evict_first, aligned=True, row_batches=True, fast_memory=False):
    """Launch shape for an (rows, cols) problem with elem_bytes-wide logits, row_stride elements
    apart, on num_sms SMs, read with evict-first loads or plain ones (_evict_first); aligned: the
    first logit lies on the 16-byte grid; row_batches: whether the row-batch kernel may take it;
    fast_memory: the GPU's memory is fast per SM (_fast_memory), where evict-first reads keep the
    plain reads' shapes."""
    per_vec = 16 // elem_bytes
    max_grid = num_sms * _CTAS_PER_SM
    whole_vecs = cols // per_vec  # at most, wherever the row starts
    if rows == 1 and whole_vecs <= _ONE_ROW_THREADS * _BATCH:
        # A lone row of up to 128 KB: one CTA of as many threads as hold a batch of it each. It took
        # 1 x 4096 in 4.4-4.7 us against 5.6-5.8 through the general kernel (read: 3.7), and rows of
        # 64-128 KB in 5.2-7.1 us against 8.0-9.5 split across CTAs (bench/PERF.md, session 15).
        threads = max(32, _pow2_at_least(-(-whole_vecs // _BATCH)))
        return _Plan(1, threads, 1, -(-cols // per_vec) * per_vec, 1, 1, one_row=True)
    batch_rows = _batch_rows(rows, cols, row_stride, elem_bytes, num_sms, aligned) if row_batches else 0
    if batch_rows:
        return _Plan(max_grid, _THREADS, 1, cols, 1, -(-rows // batch_rows), 0, batch_rows)
    fit = _tile_fit(rows, cols, row_stride, elem_bytes)
    tile_rows = _tile_rows(rows, fit, max_grid) if fit else 0
    if tile_rows and evict_first and not fast_memory and cols * elem_bytes >= _EVICT_FIRST_TILE_MIN_ROW:
        # Evict-first tiles stream faster with fewer of them in flight: 2 CTAs per SM read 65536 x
        # 1000 bf16 in 54.1 us against 57.1, 200000 x 200 fp32 in 64.5 against 67.6, 4096 x 129
        # fp32 in 8.4 against 9.7. Tiles of shorter rows, more arithmetic per byte, can need every
        # CTA (262144 x 250 bf16, rows of 500 bytes: 10 us slower; 1000000 x 10: 2 us), and so do
        # rows in registers (32768 x 4096 bf16: 4.9 us slower). Nor may fewer CTAs turn one wave of
        # tiles into a wave and a bit (8192 x 300 fp32: 1.3 us slower). Not where memory is fast
        # (_fast_memory): there evict-first tiles on every CTA read 65536 x 1000 bf16 in 44.9 us, on
        # 2 per SM in 50.4 (47.3 plain).
        fewer = num_sms * _EVICT_FIRST_TILE_CTAS
        fewer_rows = _tile_rows(rows, fit, fewer)
        one_wave_of_every_cta = -(-rows // tile_rows) <= max_grid
        one_wave_of_fewer = -(-rows // fewer_rows) <= fewer
        if one_wave_of_fewer or not one_wave_of_every_cta:
            max_grid, tile_rows = fewer, fewer_rows
    if tile_rows:
        # A group of a power of two threads (at most a warp) per row, so that the CTA's groups
        # cover the tile's rows about once over; a thread per row where a tile has more rows than
        # the CTA has threads (whole sweeps of them: _tile_rows).
        group = 1 << min(5, max(0, (_THREADS // tile_rows).bit_length() - 1))
        chunks = -(-rows // tile_rows)
        return _Plan(max(1, min(max_grid, chunks)), group, 1, -(-cols // per_vec) * per_vec, 1, chunks, tile_rows)
    row_vecs = -(-cols // per_vec)
    splits = -(-cols // _MAX_SEG)
    # Fewer rows than CTAs: cut each row into segments so that every SM streams, as long as a
    # segment still gives every thread of its CTA a full batch (shorter rows are cheaper whole).
    if 0 < rows < max_grid:
        splits = max(splits, min(max_grid // rows, row_vecs // (_BATCH * _THREADS), _SEG_SLAB))
    seg_len = -(-cols // splits)
    seg_len = -(-seg_len // per_vec) * per_vec
    splits = max(1, -(-cols // seg_len))
    items = rows * splits
    if splits > 1:
        group = _THREADS  # segments are few and long: a whole CTA on each
    else:
        # Evict-first loads stream faster when each batch of a CTA covers whole rows, one stretch of
        # memory, than when its groups walk their rows batch by batch: 32768 x 4096 bf16 100.4 us
        # against 105.0 (103.6 plain), 16384 x 4096 bf16 55.5 against 58.7. Plain loads measured
        # the same either way (bench/PERF.md). Not where memory is fast: there a thread's second
        # batch in flight counts for more (H200, evict-first: 32768 x 4096 bf16 77.8 us against
        # 87.1, 8192 x 16384 bf16 78.6 against 87.3).
        seg_vecs = -(-seg_len // per_vec)
        vecs_per_thread = _BATCH if evict_first and not fast_memory else _VECS_PER_THREAD
        group = min(_THREADS, _pow2_at_least(-(-seg_vecs // vecs_per_thread)))
        # That group can leave up to half of each thread's slots empty: rows just over a power of two
        # of vectors (4100 fp32 columns, 1025 vectors: 4 or 5 a thread of 8). Where a row fills less
        # than _MIN_SLOT_FILL of them, half the group streams faster: each thread's first batch is
        # full, and a CTA has twice the groups, whose loads overlap each other's reductions. 16368 x
        # 4100 fp32 (evict-first) took 101.0 us against 138.7, 32704 x 4104 bf16 105.8 against 149.6
        # (read: 99.4, 99.2). Not where the group's slots are fuller (9586 x 7000 fp32, one batch 85%
        # full: 4 points slower halved; 44739 x 3000 fp32, two batches 73% full: 5 points), nor on rows
        # longer than a round of the largest group, where halving measured either way (bench/PERF.md).
        slots = vecs_per_thread * group
        if group >= 32 and seg_vecs <= vecs_per_thread * _THREADS and seg_vecs < _MIN_SLOT_FILL[vecs_per_thread] * slots:
            group //= 2
        # Few rows leave SMs idle: more threads per row while the CTAs still get an SM each (64 x
        # 5000: 64 CTAs, not 16). Past one CTA per SM, bigger groups measured slower (300 x 4096,
        # 1000 x 4096). (A lone row is here only when it is split: the one-row kernel takes the rest.)
        while group < _THREADS and -(-rows // (_THREADS // (2 * group))) <= num_sms:
            group *= 2
    # Chunks of one round each, claimed as CTAs finish them, balance the end of the stream. Where
    # a round is only a few KB (very short rows) the claim's barrier and partial cost more than
    # they balance: then each CTA gets one chunk of as many rounds as its share needs.
    groups = _THREADS // group
    round_bytes = groups * min(seg_len, cols) * elem_bytes
    rounds = 1 if round_bytes >= _CLAIM_BYTES else max(1, -(-items // (groups * max_grid)))
    chunks = -(-items // (groups * rounds))
    lead_256 = _lead_256(group, [cols] if splits == 1 else [seg_len, cols - (splits - 1) * seg_len], per_vec, evict_first)
    # Every CTA that fits on the GPU at once, while there are chunks for them.
    return _Plan(max(1, min(max_grid, chunks)), group, splits, seg_len, rounds, chunks, lead_256=lead_256)


def _lead_256(group, lengths, per_vec, evict_first):
    """Whether reduce_segment counts the vectors of each item (a row, or a segment of `lengths[k]`
    columns) from the 256-byte boundary at or below its body: a lead of up to 15 vectors that no lane
    loads, so that each warp's load covers whole 256-byte blocks. Plain loads take it in every group
    of two threads or more (a lone thread never does: see reduce_segment). Evict-first loads take it
    only in groups of 64 threads or more, where every item has at least two batches, and where the
    lead changes none of them wherever the item starts (as many batches, the last riding along or
    not). There, H100, us: 4096 x 32001 bf16 100.7 against 102.7, 3000 x 40001 bf16 94.7 against 97.2,
    20000 x 6001 bf16 (groups of 64) 93.1 against 94.9. Where the lead added a batch (8192 x 16385
    bf16: rows of 2047 or 2048 vectors) it gained 4.4 us on one machine and lost 1.6-3.3 on others;
    rows of one batch lost 1.0-1.2 us (16000 x 7001 bf16), groups of 32 went either way
    (bench/PERF.md)."""
    if group == 1:
        return False
    if not evict_first:
        return True
    if group < _EVICT_FIRST_LEAD_MIN_GROUP:
        return False
    batch = _BATCH * group

    def last_batch(end):  # its first vector
        return (end - 1) // batch * batch

    def rides(end):  # the last batch rides along with the one before it (reduce_segment's short tail)
        return last_batch(end) > 0 and end - last_batch(end) <= _SHORT_TAIL * group

    for length in lengths:
        # The body's end in vectors, lead included: fewest where the item starts one element past the
        # 16-byte grid and takes no lead, most where it starts on that grid 15 vectors past the 256-byte
        # one. Both ends of that range in the same last batch, after a first one, and riding alike.
        fewest, most = (length - per_vec + 1) // per_vec, length // per_vec + 15
        if last_batch(fewest) < batch or last_batch(most) != last_batch(fewest) or rides(most) != rides(fewest):
            return False
    return True


def _evict_first(logit_bytes, l2_bytes, elem_bytes, row_batches, tiles=False, fast_memory=False):
    """Whether the kernel reads the logits with evict-first loads, which leave the rest of L2 in
    place. Where L2 holds dirty lines (KernelBench's flush; in training, another kernel's output)
    that saves their write-back, about 9.5 us on the H100, but the read streams a few % slower
    while they stay; with a clean L2 both loads read alike. On the kernel (with _plan's one batch
    per item) the saving won up to 250-384 MiB of logits, by shape, and lost from 312-448 MiB
    (bench/PERF.md): up to 6 L2 sizes (300 MiB on the H100) read evict-first. The row-batch kernel
    (row_batches) reads 16-bit rows faster evict-first at every size measured, 384 MiB to 1 GiB
    (1.2 to 8.2 us), and its fp32 rows slower past 300 MiB (0.4 to 10.8 us), as the others.
    Where memory is fast (_fast_memory, the H200; 6 L2 sizes are 360 MiB there) the same rule
    holds as long as _plan keeps every thread's second batch and every SM's third CTA: 16-bit rows
    in registers won up to 312 MiB (1.3 to 2.5 us) and lost at 785, tiles won at 62 to 250 MiB
    (65536 x 1000 bf16: 44.9 us against 47.3 plain). Not fp32 rows outside tiles: they won up to
    192 MiB and lost from 250 (0.8 to 4.6 us), so they read evict-first up to 3 L2 sizes."""
    if fast_memory and elem_bytes == 4 and not tiles:
        return logit_bytes <= _FAST_MEMORY_L2S * l2_bytes
    return logit_bytes <= _EVICT_FIRST_L2S * l2_bytes or (row_batches and elem_bytes == 2)


def _fast_memory(gpu):
    """Whether the GPU's memory outruns the row-batch kernel past a few L2 sizes of logits. That
    kernel keeps one 16 KB batch per CTA in flight, 48 KB per SM, which on an H200 streamed about
    3.4 TB/s, 26 GB/s per SM: the H100's peak is 25 GB/s per SM, the H200's 36. There, past 3 L2
    sizes, rows in registers (96 KB per SM in flight) read 512 MiB of fp32 in 133.6 us against
    161.3 (read: 131.6) and 256 MiB of bf16 in 79.8 against 81.3; up to 160 MiB row batches were
    still the faster or as fast (bench/PERF.md, session 16). The peak is the memory clock (double
    data rate) times the bus width; where torch does not report them, the H100's rules apply."""
    peak = 2e3 * getattr(gpu, "memory_clock_rate", 0) * getattr(gpu, "memory_bus_width", 0) / 8
    return peak > _FAST_MEMORY_PER_SM * gpu.multi_processor_count


@functools.lru_cache(maxsize=1024)
def _plan_on(device_index, rows, cols, row_stride, elem_bytes, aligned):
    """The launch plan for (rows, cols) logits as _plan takes them, on GPU device_index, and whether
    it reads them evict-first. Cached, because the host's time per call shows in KernelBench's
    timing (see _cross_entropy_mean); a test that changes the policy clears it. _plan picks the
    kernel without regard to the kind of load (which only resizes tiles and groups), and the kind
    of load depends on the kernel: a first plan gives the kernel, the second the shape."""
    gpu = _device_properties(device_index)
    num_sms, l2_bytes, logit_bytes = gpu.multi_processor_count, gpu.L2_cache_size, rows * cols * elem_bytes
    fast_memory = _fast_memory(gpu)
    may_batch_rows = not fast_memory or logit_bytes <= _FAST_MEMORY_L2S * l2_bytes
    plan_with = functools.partial(_plan, rows, cols, row_stride, elem_bytes, num_sms, aligned=aligned,
                                  row_batches=may_batch_rows, fast_memory=fast_memory)
    kernel = plan_with(evict_first=False)
    evict_first = _evict_first(logit_bytes, l2_bytes, elem_bytes, kernel.batch_rows > 0, kernel.tile_rows > 0, fast_memory)
    return plan_with(evict_first=evict_first), evict_first


def _workspace_layout(plan, rows):
    """Byte offsets of the exact sum and the segment partials, and the bytes in all. The counters
    fill the first 16 bytes (CTAs finished, chunks claimed, rows ignored: 64-bit), the exact sum's
    words the next 80 (16-byte loads), and segments (splits > 1) have an (m, s, x_t) partial each."""
    exact_off = 16
    seg_off = exact_off + 8 * _EXACT_WORDS
    seg_bytes = 16 * rows * plan.splits if plan.splits > 1 else 0
    return exact_off, seg_off, seg_off + seg_bytes


# ---------------------------------------------------------------------------------------------
# Build: at import, for the GPU that is present; nvcc sees no torch headers, which keeps a cold
# build short.
def _nvcc_flags(arch_flags, ptxas=None):
    return ["-O3", "-std=c++17", f"-DCE_THREADS={_THREADS}", f"-DCE_CTAS_PER_SM={_CTAS_PER_SM}", f"-DCE_BATCH={_BATCH}",
            f"-DCE_TILE_TARGETS={_TILE_TARGETS}", f"-DCE_SEG_SLAB={_SEG_SLAB}", f"-DCE_ROW_BATCH_LOADS={_ROW_BATCH_LOADS}",
            f"-DCE_EXACT_WORDS={_EXACT_WORDS}", f"-DCE_ONE_ROW_THREADS={_ONE_ROW_THREADS}", f"-DCE_SHORT_TAIL={_SHORT_TAIL}",
            *arch_flags,
            *_parallel_ptxas_flags(ptxas)]


def _parallel_ptxas_flags(ptxas):
    """ptxas assembles the kernels on every core (-split-compile=0): the same machine code, kernel by
    kernel, and a cold build about 5 s shorter on a 16-core host. Not nvcc's own --split-compile,
    which splits the optimizer's module too and changed the code of 44 kernels. Only where this
    toolkit's ptxas lists the option: an older one rejects it."""
    if not ptxas or not os.access(ptxas, os.X_OK):
        return []
    usage = subprocess.run([ptxas, "--help"], capture_output=True, text=True).stdout
    return ["-Xptxas", "-split-compile=0"] if "--split-compile" in usage else []


def _build_options():
    """The kernel needs no torch headers: where load_inline can leave them out, a cold build is shorter."""
    return {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}


def _load_extension():
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise RuntimeError(f"the cross-entropy kernel needs compute capability 8.0 or newer; this GPU has {major}.{minor}")
    arch = f"{major}{minor}"
    return load_inline(
        name=f"kb95_cross_entropy_sm{arch}",
        cpp_sources=[_CPP_SRC],
        cuda_sources=[_CUDA_SRC],
        extra_cflags=["-O2"],
        extra_cuda_cflags=_nvcc_flags([f"-gencode=arch=compute_{arch},code=sm_{arch}"],
                                      os.path.join(CUDA_HOME, "bin", "ptxas") if CUDA_HOME else None),
        verbose=False,
        **_build_options(),
    )


_ext = _load_extension()

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_TARGET_DTYPES = (torch.int64, torch.int32)
_workspaces = {}  # (device index, stream) -> int32 tensor whose counters and exact sum are back at zero


@functools.lru_cache(maxsize=None)
def _device_properties(device_index):
    return torch.cuda.get_device_properties(device_index)


# The current stream's handle as an integer: torch's raw accessor takes 0.1 us where
# torch.cuda.current_stream(device).cuda_stream takes 3-5 (H100 host); the public spelling where a
# torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device_index):
    return _raw_stream(device_index) if _raw_stream else torch.cuda.current_stream(device_index).cuda_stream


def _workspace(device_index, stream, nbytes):
    """Scratch for one launch: per stream, so concurrent streams never share a counter."""
    key = (device_index, stream)
    ws = _workspaces.get(key)
    if ws is not None and ws.numel() * 4 >= nbytes:
        return ws
    # Zeroed once here; every launch leaves its counters at zero again. Inside graph capture the
    # zeroing becomes part of the graph, and the buffer lives only as long as the graph needs it.
    ws = torch.zeros(-(-nbytes // 4), dtype=torch.int32, device=device_index)
    if not torch.cuda.is_current_stream_capturing():
        _workspaces[key] = ws
    return ws


def _check_inputs(logits, targets):
    # Each tensor attribute is read once or twice: this runs on every call, ahead of the launch.
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("cross_entropy expects two tensors: logits and class-index targets")
    if logits.dtype not in _DTYPE_CODES:
        raise TypeError(f"logits must be float32, bfloat16 or float16; got {logits.dtype}")
    if targets.dtype not in _TARGET_DTYPES:
        if targets.dtype.is_floating_point:
            raise TypeError("targets must be int64 or int32 class indices; "
                            f"got {targets.dtype} (class-probability targets are not supported)")
        raise TypeError(f"targets must be int64 or int32 class indices; got {targets.dtype}")
    if not (logits.is_cuda and targets.is_cuda):
        raise ValueError(f"logits and targets must be CUDA tensors; got {logits.device} and {targets.device}")
    if logits.get_device() != targets.get_device():
        raise ValueError(f"logits and targets are on different devices: {logits.device} and {targets.device}")
    shape, target_shape = logits.shape, targets.shape
    if len(shape) not in (1, 2):
        raise ValueError(f"logits must have shape (N, C) or (C,); got {tuple(shape)}")
    if len(target_shape) != len(shape) - 1:
        raise ValueError(f"targets must have shape (N,) for logits (N, C), or () for logits (C,); "
                         f"got {tuple(target_shape)} for {tuple(shape)}")
    if len(shape) == 2 and target_shape[0] != shape[0]:
        raise ValueError(f"batch sizes differ: logits have {shape[0]} rows, targets {target_shape[0]}")
    if shape[-1] == 0:
        raise ValueError("logits have no classes (C = 0)")
    if shape[-1] > _MAX_SEG * _SEG_SLAB:
        raise ValueError(f"logits have {shape[-1]} classes; at most {_MAX_SEG * _SEG_SLAB} are supported")
    if _ext is None:
        raise RuntimeError("the cross-entropy extension was not built: no CUDA device was visible at import")


def _first_bad_target(targets, cols):
    """Raises ValueError naming the first row whose target is outside [0, C) and not -100."""
    bad = (targets != _IGNORE_INDEX) & ((targets < 0) | (targets >= cols))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"targets[{row}] = {int(targets[row])} is outside [0, {cols}) "
                         f"and is not the ignore index {_IGNORE_INDEX}")


# KernelBench's timing starts before the call and ends after the kernel, with an L2 flush of about
# 90 us queued ahead of both: host work that outlasts the flush shows in the time. At 41 us a call
# it did in about one trial of ten (H100: 32768 x 4096 fp32 mean 184.3-186.5 us, p90 191-197,
# where the same launches replayed from a CUDA graph took 182.3-182.5); at this dispatch's 20 us
# (the module call included) the mean is the graph's (182.4, p90 183.1). So the dispatch reads
# each tensor attribute once, plans once per problem (_plan_on), and asks torch for the raw stream
# handle.
def _cross_entropy_mean(logits, targets, check_targets=False):
    _check_inputs(logits, targets)
    if logits.dim() == 1:
        logits, targets = logits.unsqueeze(0), targets.reshape(1)
    if logits.stride(1) != 1 and logits.shape[1] > 1:
        logits = logits.contiguous()  # the kernel streams along rows; columns must be adjacent
    rows, cols = logits.shape
    if check_targets:
        _first_bad_target(targets, cols)
    index, row_stride, logits_ptr, elem_bytes = logits.get_device(), logits.stride(0), logits.data_ptr(), logits.element_size()
    plan, evict_first = _plan_on(index, rows, cols, row_stride, elem_bytes, logits_ptr % 16 == 0)
    exact_off, seg_off, nbytes = _workspace_layout(plan, rows)
    stream = _current_stream(index)
    # Held until the launch: inside graph capture it is not cached, and a buffer freed there would be
    # handed to the next allocation of the capture.
    ws = _workspace(index, stream, nbytes)
    base = ws.data_ptr()
    out = torch.empty((), dtype=logits.dtype, device=logits.device)
    _ext.launch(logits_ptr, targets.data_ptr(), out.data_ptr(), base, base + exact_off, base + seg_off,
                rows, cols, row_stride, targets.stride(0) if rows else 1, _DTYPE_CODES[logits.dtype],
                targets.element_size(), plan.splits, plan.seg_len, plan.group, plan.rounds, plan.chunks,
                plan.tile_rows, plan.batch_rows, plan.one_row, plan.lead_256, evict_first, plan.grid, index, stream)
    return out


class ModelNew(torch.nn.Module):
    """Mean cross-entropy over rows, computed by one fused CUDA kernel (forward only)."""

    def __init__(self, check_targets=None):
        super().__init__()
        if check_targets is None:
            check_targets = os.environ.get("CROSS_ENTROPY_CHECK_TARGETS", "0") not in ("", "0")
        self.check_targets = bool(check_targets)

    def forward(self, predictions, targets):
        return _cross_entropy_mean(predictions, targets, self.check_targets)
