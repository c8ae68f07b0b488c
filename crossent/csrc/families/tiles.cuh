// Family: tiles of short rows.
#pragma once

#include "../common/row_end.cuh"

namespace {

// Rows of a few KB give a group one or two batches each, and a thread would wait a whole round trip
// per row with nothing else in flight. Such rows are read as tiles instead: `tile_rows`
// neighbouring rows lie in one stretch of memory, which the whole CTA loads with 16-byte vectors
// (kBatch per thread, 32 KB) into registers, then stores to shared memory, where groups reduce the
// rows. The next tile's loads are issued before the rows of this one are reduced, so each CTA
// keeps a tile in flight all the time; the target logit comes from shared memory too. A chunk is
// a tile. kSweeps: how each row is reduced (tile_row_lse), a kernel each: in one kernel, each kind
// of row ran slower ("Short rows").
constexpr int kTileVecs = kThreads * kBatch;         // whole vectors a tile's stretch may hold
constexpr int kTileRows = kThreads * kTileTargets;   // rows a tile may hold

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
      if (threadIdx.x + k * kThreads < t.rows) targets[threadIdx.x + k * kThreads] = target_code(p, target[k]);
  }
};

// Rows shorter than this many elements (4 vectors) are reduced element by element or in pairs
// (short_row_sweeps, short_row_pair_sweeps).
template <class E>
constexpr int kShortRowElems = 4 * E::kPerVec;

// A row in shared memory, reduced by its group in two sweeps: the max first, agreed on by the
// group, then the sum of exp against that one base. Reading the row twice from shared memory costs
// less than rescaling a running sum batch by batch, and holds no batch in registers while the
// next tile's loads do. The row is elements [start, start + len) of the tile, whose slot 0 is
// 16-byte aligned, so the row's cut at 16-byte boundaries follows from start alone. Rows of
// kShortRowElems elements or more. Every lane of the warp must call it (len 0 for rows it skips).
// With label smoothing (kSmooth), the second sweep also sums base - x into gap, in every lane.
template <class E, bool kSmooth>
__device__ __forceinline__ Lse row_lse_shared(const uint4* tile, int start, int len, int lane, int group, float& gap) {
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
  float g = 0.f;
  float s = sum_exp(base, [&](auto exponent) {
    float s0 = 0.f, s1 = 0.f;
    for (const uint4* v = body + lane; v < end; v += group) {
      const uint4 q = *v;
#pragma unroll
      for (int i = 0; i < E::kPerVec; i += 2) {
        s0 += exp2_approx(exponent(E::at(q, i)));
        s1 += exp2_approx(exponent(E::at(q, i + 1)));
        if (kSmooth) g += (base - E::at(q, i)) + (base - E::at(q, i + 1));
      }
    }
    for (int k = lane; k < nedge; k += group) {
      s0 += exp2_approx(exponent(edge(k)));
      if (kSmooth) g += base - edge(k);
    }
    return s0 + s1;
  });
  if (kSmooth) gap = lanes_sum(g, group);
  return {m, lanes_sum(s, group)};
}

// Rows of fewer than kShortRowElems elements, element by element in the same two sweeps: cutting
// them at 16-byte boundaries costs more than it saves. The sweeps are unrolled so that a lane's
// loads from shared memory go out together. kStride: 1 where each thread takes whole rows (group
// 1, which the host gives tiles of many rows), so that the unrolled loop's trip count is len
// itself; 0 for a group's lanes at a stride of `group`, known only at run time, whose trip count
// costs an integer division per sweep ("Short rows").
template <class E, int kStride, bool kSmooth>
__device__ __forceinline__ Lse short_row_sweeps(const typename E::Storage* row, int len, int lane, int group, float& gap) {
  const int first = kStride ? 0 : lane, stride = kStride ? kStride : group;
  float m = -INFINITY;
#pragma unroll 4
  for (int k = first; k < len; k += stride) m = fmaxf(m, E::value(row[k]));
  m = lanes_max(m, stride);
  const float base = safe_base(m);
  float g = 0.f;
  const float s = sum_exp(base, [&](auto exponent) {
    float s0 = 0.f;
#pragma unroll 4
    for (int k = first; k < len; k += stride) {
      s0 += exp2_approx(exponent(E::value(row[k])));
      if (kSmooth) g += base - E::value(row[k]);
    }
    return s0;
  });
  if (kSmooth) gap = lanes_sum(g, stride);
  return {m, lanes_sum(s, stride)};
}

// Rows of fewer than kShortRowElems elements, a thread each, that start on a pair's boundary and
// hold an even number of elements (the host's policy._sweeps): the same two sweeps over pairs (the
// format's Pair), so that one load from shared memory brings two elements, and in 16-bit formats
// the max sweep runs on the packed pairs (max.bf16x2, max.f16x2). Float32 rows of an even width are
// also spared the bank conflicts of 4-byte loads: rows 10 words apart put two lanes of a warp on
// each bank.
template <class E, bool kSmooth>
__device__ __forceinline__ Lse short_row_pair_sweeps(const typename E::Storage* row, int len, float& gap) {
  using Pair = typename E::Pair;
  const Pair* pairs = reinterpret_cast<const Pair*>(row);
  const int n = len >> 1;
  Pair mx = E::neg_inf_pair();
#pragma unroll 4
  for (int k = 0; k < n; ++k) mx = E::pair_max(mx, pairs[k]);
  const float m = E::word_max(mx);
  const float base = safe_base(m);
  float g = 0.f;
  const float s = sum_exp(base, [&](auto exponent) {
    float s0 = 0.f, s1 = 0.f;
#pragma unroll 4
    for (int k = 0; k < n; ++k) {
      const Pair w = pairs[k];
      s0 += exp2_approx(exponent(E::low(w)));
      s1 += exp2_approx(exponent(E::high(w)));
      if (kSmooth) g += (base - E::low(w)) + (base - E::high(w));
    }
    return s0 + s1;
  });
  if (kSmooth) gap = g;
  return {m, s};
}

// The (m, s) of the row at elements [start, start + len) of the tile, by kSweeps: rows of
// kShortRowElems elements or more cut at 16-byte boundaries, shorter ones element by element (at a
// stride of 1 where a thread takes whole rows) or in pairs; with label smoothing (kSmooth), its
// Gap, summed in the same sweep as the exps (a compile-time choice: a run-time one slowed the
// options build's other calls). Every lane of the warp must call it (len 0 for rows it skips).
template <class E, int kSweeps, bool kSmooth>
__device__ __forceinline__ Lse tile_row_lse(const uint4* vecs, int start, int len, int lane, int group, Gap& gap) {
  const auto* row = reinterpret_cast<const typename E::Storage*>(vecs) + start;
  gap = {0.f, float(len)};
  if constexpr (kSweeps == kPairSweeps) return short_row_pair_sweeps<E, kSmooth>(row, len, gap.sum);
  else if constexpr (kSweeps == kElementSweeps)
    return group == 1 ? short_row_sweeps<E, 1, kSmooth>(row, len, lane, group, gap.sum)
                      : short_row_sweeps<E, 0, kSmooth>(row, len, lane, group, gap.sum);
  else return row_lse_shared<E, kSmooth>(vecs, start, len, lane, group, gap.sum);
}

// The rows of a tile in shared memory, a row per group at a time; leaders add their rows' losses
// (and class weights, from `weights` in shared memory where weighted) and count those of ignore_index.
template <class E, int kSweeps>
__device__ __forceinline__ void tile_loss(const Params& p, const TileSpan<E>& t, const uint4* vecs, const int* targets,
                                          const typename E::Storage* weights, int lane, int group, float& loss_sum,
                                          float& weight_sum, unsigned int& ignored) {
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
    // Ignored rows and bad targets need no sum, unless every row's log-sum-exp is asked for.
    const int len = target >= 0 || (every_row(p) && r < t.rows) ? int(p.cols) : 0;
    Gap gap;
    const Lse st = smoothing(p) ? tile_row_lse<E, kSweeps, true>(vecs, start, len, lane, group, gap)
                                : tile_row_lse<E, kSweeps, false>(vecs, start, len, lane, group, gap);
    if (lane == 0 && r < t.rows) {
      const float weight = weighted(p) && target >= 0 ? E::value(weights[target]) : 1.f;
      const float loss = row_outcome<E>(p, t.row0 + r, target, st, target >= 0 ? E::value(elems[start + target]) : 0.f,
                                        weight, gap);
      if (target == kTargetIgnored) {
        ++ignored;
      } else {
        loss_sum += loss;
        weight_sum += weight;
      }
    }
  }
}

template <class E, class Target, int kSweeps, bool kEvictFirst>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_tiles_kernel(const Params p) {
  __shared__ float warp_sums[2][kChunkSums];  // end_chunk's, by chunk parity
  __shared__ long long claimed[2];         // the chunk after next, by chunk parity
  __shared__ uint4 tile_vecs[kTileVecs + 2];  // a tile's vectors, a spare slot at each end
  __shared__ int tile_targets[kTileRows];
  // Weighted (the options build): every class's weight, read per row from here. Weighted problems
  // take tiles only where the weights fit (the host's policy._family).
  __shared__ uint4 class_weight_vecs[kOptions ? kTileVecs / kTileMinRows : 1];
  auto* const class_weights = reinterpret_cast<typename E::Storage*>(class_weight_vecs);

  const int group = p.group;
  const int lane = threadIdx.x & (group - 1);
  unsigned int* const claim_counter = p.counter + 1;
  ChunkClaims claims;
  TileLoads<E, Target, kEvictFirst> tile;  // the next tile, in flight
  if (claims.chunk < p.chunks) tile.issue(p, tile_span<E>(p, claims.chunk));
  if (weighted(p)) {  // while the first tile is on its way; the first barrier orders these stores
    const auto* w = static_cast<const typename E::Storage*>(p.weight);
    for (int c = threadIdx.x; c < p.cols; c += kThreads) class_weights[c] = w[c];
  }
  unsigned int ignored = 0;  // leaders: the rows of ignore_index they met; the mean divides by the rest

  for (int parity = 0; claims.chunk < p.chunks; parity ^= 1) {  // the same in every thread
    const unsigned int claim = claims.claim(claim_counter);
    float loss_sum = 0.f, weight_sum = 0.f;  // leaders: this group's rows of the tile, in order; 0 elsewhere
    // The last chunk's barrier (end_chunk) is past every read of the previous tile.
    const TileSpan<E> span = tile_span<E>(p, claims.chunk);
    tile.store(p, span, tile_vecs, tile_targets);
    if (claims.next < p.chunks) tile.issue(p, tile_span<E>(p, claims.next));
    __syncthreads();
    tile_loss<E, kSweeps>(p, span, tile_vecs, tile_targets, class_weights, lane, group, loss_sum, weight_sum, ignored);
    end_chunk(p, true, loss_sum, weight_sum, group, warp_sums[parity], claims, claim, &claimed[parity]);
    claims.advance(&claimed[parity]);
  }

  if (!arrive_last(p, ignored, true)) return;
  reset_claims(claim_counter);
  store_result<E>(p, whole_rows_total(p));
}

}  // namespace
