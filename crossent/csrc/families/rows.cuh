// Family: rows in registers.
#pragma once

#include "../common/row_end.cuh"

namespace {

// Long rows (4096 x 32000, 8192 x 128256), and any row the other families do not take. `group`
// consecutive threads (a power of two, up to a CTA) reduce one item, a row or one of `splits`
// segments of it where rows are too few to fill the GPU, through batches of kBatch 16-byte
// vectors a thread; a chunk is `rounds` items per group of the CTA, interleaved so that a round of
// neighbouring chunks covers neighbouring items. Segments leave an (m, s, x_t) partial each, which
// the last CTA merges per row (segments_total).

// An item as its group reads it: cut at 16-byte boundaries, its whole vectors counted from `lead`
// vectors before the body (0 unless kLead256: the 256-byte boundary at or below the body, so that
// each warp's load covers whole 256-byte blocks of memory; the host's policy._lead_256 says where). A
// thread alone on its row never takes a lead: its first batch, kBatch vectors, could not cover one
// of up to 15, and its warp's load spans 32 rows whatever the grid.
struct ItemLayout {
  Aligned cut;
  int tail;   // the first element past the whole vectors
  int lead;   // vectors before the body that no lane loads
  int end;    // the body's end, in vectors from the lead's start
  int nedge;  // elements outside the whole vectors: at most 2 * (kPerVec - 1)
};
template <class E, bool kLead256>
__device__ __forceinline__ ItemLayout item_layout(const typename E::Storage* seg, int len, int group) {
  ItemLayout at;
  at.cut = align_stretch<E>(seg, len);
  at.tail = at.cut.head + at.cut.nvec * E::kPerVec;
  at.lead = kLead256 && group > 1 ? int(reinterpret_cast<uintptr_t>(seg + at.cut.head) >> 4) & 15 : 0;
  at.end = at.lead + at.cut.nvec;
  at.nedge = at.cut.head + (len - at.tail);
  return at;
}

// Where the target logit, column tcol of the item (-1: not in it), lies as the group reads it:
// element `elem` of body vector `vec`, or edge `edge` (-1: in the body or not in the item); `lane`
// reads it. item_lse sets `u` just before the first batch, where it schedules best (docs/design, "Long rows"):
// in that lane, the target's vector counted in the lane's vectors from the current batch on;
// negative (so, unsigned, out of range) in every other lane.
struct TargetPlace {
  bool in_body;
  int vec, elem, edge, lane, u;
};
template <class E>
__device__ __forceinline__ TargetPlace place_target(const ItemLayout& at, int tcol, int group) {
  TargetPlace t;
  t.in_body = tcol >= at.cut.head && tcol < at.tail;
  t.vec = (tcol - at.cut.head) / E::kPerVec;
  t.elem = (tcol - at.cut.head) % E::kPerVec;
  t.edge = tcol < 0 || t.in_body ? -1 : edge_number<E>(at.cut, tcol);
  t.lane = (t.in_body ? at.lead + t.vec : max(t.edge, 0)) & (group - 1);
  return t;
}

// The target logit out of a batch, in the lane that holds it (TargetPlace::u).
template <class E>
__device__ __forceinline__ void pick_target(const uint4 (&buf)[kBatch], const TargetPlace& t, float& x_t) {
  if (unsigned(t.u) < unsigned(kBatch)) x_t = E::at(vector_at(buf, t.u), t.elem);
}

// The edges, read as scalars. A lane's first, edge `lane`, is loaded ahead of the body and folded
// only after the first batch's loads have gone out (item_lse's fold_edge), so an item off the 16-byte grid
// waits no round trip of its own for a few bytes ("Loads"); it waits as stored, since a conversion
// beside the load would make the warp wait there. Where the group has fewer lanes than the item
// has edges (short rows far apart), the rest are folded at once (other_edges_lse), all their loads
// out before the first is used: one round trip, not one per element.
template <class E>
__device__ __forceinline__ typename E::Storage load_first_edge(const typename E::Storage* seg, const ItemLayout& at,
                                                               int lane) {
  typename E::Storage edge = E::neg_inf();
  if (lane < at.nedge) edge = __ldg(seg + edge_element<E>(at.cut, lane));
  return edge;
}
// Label smoothing (the options build, without class weights): a thread's Gap of its share of an
// item, held in its slot of shared memory, so that the row's loop keeps no register for it (rows
// in registers have none to spare: "Options"). Values arrive a batch or an edge at a time; each
// arrival rebases the slot from the state's base before it to the base after it, and adds the
// arrivals' gaps. Only the evict-first instances take label smoothing (`enabled`; the host's
// policy gives it no other): with plain loads, the row's loop spilled even so.
__shared__ float2 item_gap_slots[kOptions ? kThreads : 1];

struct ItemGaps {
  const Params& p;
  bool enabled;

  __device__ __forceinline__ bool on() const { return enabled && smoothing(p); }
  __device__ __forceinline__ Gap held() const {
    const float2 g = item_gap_slots[threadIdx.x];
    return {g.x, g.y};
  }
  __device__ __forceinline__ void clear() const {
    if (on()) item_gap_slots[threadIdx.x] = make_float2(0.f, 0.f);
  }
  // n values arrived, their gaps from `base` summing to `sum`; the slot's were from old_base.
  __device__ __forceinline__ void add(float old_base, float base, float sum, float n) const {
    const Gap h = gap_rebase(held(), old_base, base);
    item_gap_slots[threadIdx.x] = make_float2(h.sum + sum, h.weight + n);
  }
};

// lse_add_batch with label smoothing's gaps of vectors first <= u < nvalid (the others are -inf:
// past the row, or before it), in one pass: each element's x - base feeds its exp and the gaps at
// once, and the slot is rebased and added to once. A second pass over the batch kept every
// unpacked element in registers, and spilled.
template <class E>
__device__ __forceinline__ Lse lse_add_batch_gaps(Lse st, const uint4 (&buf)[kBatch], int first, int nvalid,
                                                  const ItemGaps& gaps) {
  const float m = fmaxf(st.m, vectors_max<E>(buf));
  const float base = safe_base(m), old_base = safe_base(st.m);
  float s = st.s * exp2_approx((st.m - base) * kLog2e), s1 = 0.f, d = 0.f;
#pragma unroll
  for (int u = 0; u < kBatch; ++u)
    if (u < nvalid)
#pragma unroll
      for (int i = 0; i < E::kPerVec; i += 2) {
        const float t0 = E::at(buf[u], i) - base, t1 = E::at(buf[u], i + 1) - base;
        s += exp2_approx(t0 * kLog2e);
        s1 += exp2_approx(t1 * kLog2e);
        if (u >= first) d += t0 + t1;
      }
  gaps.add(old_base, base, -d, float((nvalid - first) * E::kPerVec));
  return {m, s + s1};
}

template <class E>
__device__ __forceinline__ Lse other_edges_lse(const typename E::Storage* seg, const ItemLayout& at, int lane, int group,
                                               const TargetPlace& t, float& x_t, const ItemGaps& gaps) {
  constexpr int kMore = 2 * (E::kPerVec - 1) - 1;  // edges a lane may hold past its first
  float x[kMore];
#pragma unroll
  for (int k = 0; k < kMore; ++k) {
    const int e = lane + (k + 1) * group;
    x[k] = ((k + 1) * group < at.nedge && e < at.nedge) ? load_scalar<E>(seg + edge_element<E>(at.cut, e)) : -INFINITY;
    if (e == t.edge) x_t = x[k];
  }
  float m = x[0];
#pragma unroll
  for (int k = 1; k < kMore; ++k) m = fmaxf(m, x[k]);
  const float base = safe_base(m);
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kMore; ++k)
    if ((k + 1) * group < at.nedge) s += exp2_approx((x[k] - base) * kLog2e);  // -inf adds exp(-inf) = 0
  if (gaps.on()) {  // the slot is empty: these are the first values
    float sum = 0.f, n = 0.f;
#pragma unroll
    for (int k = 0; k < kMore; ++k)
      if ((k + 1) * group < at.nedge && lane + (k + 1) * group < at.nedge) {
        sum += base - x[k];
        n += 1.f;
      }
    gaps.add(base, base, sum, n);
  }
  return {m, s};
}
// A last batch of at most kShortTail vectors a lane costs the group a whole round trip for a few
// bytes, after its other batches are done. Its vectors ride along with the batch before it
// instead, into shared memory (cp.async holds no registers while in flight), and the last batch
// reads them from there ("Loads"). thread t's u-th vector is slot u * kThreads + t.
template <bool kEvictFirst>
struct ShortTail {
  int first;  // the last batch's first vector; later than the lead, as a lone thread has none
  bool rides;
  int with;   // the batch it rides along with: its first vector, or -1

  __device__ __forceinline__ ShortTail(const ItemLayout& at, int group, int batch_vecs) {
    first = (at.end - 1) & -batch_vecs;
    rides = first > 0 && at.end - first <= kShortTail * group;
    with = rides ? first - batch_vecs : -1;
  }
  // Called with each batch's first vector; copies the tail where it rides along with that batch.
  __device__ __forceinline__ void ride(int batch, const uint4* body, uint4* slots, int lane, int group, int end) const {
    if (batch != with) return;
#pragma unroll
    for (int u = 0; u < kShortTail; ++u) {
      const int v = first + lane + u * group;
      if (v < end) copy_vec_async<kEvictFirst>(slots + u * kThreads, body + v);
    }
  }
  // The last batch, from shared memory: its vector u of this lane, for u < kShortTail; -inf past the end.
  __device__ __forceinline__ void read(uint4 (&buf)[kBatch], const uint4* slots, int v0, int group, int end,
                                       const uint4& neg_inf) const {
    wait_copies();
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = v0 + u * group;
      buf[u] = u < kShortTail && v < end ? slots[u * kThreads] : neg_inf;
    }
  }
};

// The (m, s) of columns [0, len) of `seg` in this thread, a group's share; the target logit, column
// tcol (-1: not in the item), in the lane that reads it (x_t), and that lane's index in every lane
// (t_lane). Steps: the edges' first loads, then the body's batches (the first one predicated where
// it starts before the body or the edges wait for it; full batches without bounds checks; a
// partial last one), each folded into (m, s) as it arrives. Any start address and row stride work,
// at full speed wherever rows are aligned.
template <class E, bool kEvictFirst, bool kLead256>
__device__ __forceinline__ Lse item_lse(const typename E::Storage* seg, int len, int lane, int group, int tcol,
                                        uint4* tail_slots, float& x_t, int& t_lane, const ItemGaps& gaps) {
  Lse st = {-INFINITY, 0.f};
  const ItemLayout at = item_layout<E, kLead256>(seg, len, group);
  TargetPlace t = place_target<E>(at, tcol, group);
  t_lane = t.lane;
  gaps.clear();
  // The edges: this lane's first waits as loaded until the first batch's loads are out (fold_edge).
  const typename E::Storage edge = load_first_edge<E>(seg, at, lane);
  if (at.nedge > group) st = other_edges_lse<E>(seg, at, lane, group, t, x_t, gaps);
  auto fold_edge = [&] {
    const float x = E::value(edge), old_base = safe_base(st.m);
    if (lane == t.edge) x_t = x;
    st = lse_merge(st, {x, 1.f});  // exp(x - x) = 1; for x = -inf it adds 0, NaN and +inf give NaN
    if (gaps.on() && lane < at.nedge) gaps.add(old_base, safe_base(st.m), safe_base(st.m) - x, 1.f);
  };
  // A batch folded into (m, s), and into the gaps: vectors first <= u < nvalid of it are the body's.
  // The last batch skips its missing vectors' exps (last); the others' read as -inf, adding 0.
  auto add_batch = [&](const uint4 (&b)[kBatch], int first, int nvalid, bool last) {
    if (!gaps.on()) {
      st = last ? lse_add_batch<E>(st, b, nvalid) : lse_add_batch<E>(st, b);
      return;
    }
    st = lse_add_batch_gaps<E>(st, b, first, min(nvalid, kBatch), gaps);
  };

  const uint4* body = reinterpret_cast<const uint4*>(seg + at.cut.head) - at.lead;
  const int group_shift = __ffs(group) - 1;  // group is a power of two
  const int end = at.end;
  const uint4 neg_inf = neg_inf_vec<E>();
  uint4 buf[kBatch];
  int v0 = lane;
  const ShortTail<kEvictFirst> tail(at, group, kBatch << group_shift);
  t.u = t.in_body && lane == t.lane ? (at.lead + t.vec) >> group_shift : -1;
  // The first batch, where it starts before the body (the vectors before it read as -inf, which
  // adds nothing) or the edges wait for it.
  if ((at.lead > 0 || at.nedge > 0) && v0 < end) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = v0 + u * group;
      buf[u] = neg_inf;  // the load writes under a predicate: a select after it would wait for it
      if (v >= at.lead && v < end) buf[u] = load_vec<kEvictFirst>(body + v);
    }
    tail.ride(0, body, tail_slots, lane, group, end);
    if (at.nedge > 0) fold_edge();
    pick_target<E>(buf, t, x_t);
    add_batch(buf, at.lead > v0 ? (at.lead - v0 + group - 1) >> group_shift : 0, (end - v0 + group - 1) >> group_shift,
              false);
    v0 += kBatch * group;
    t.u -= kBatch;
  } else if (at.nedge > 0) {
    fold_edge();
  }
  // Batches full in every lane of the warp (of the group, where it is smaller): no bounds checks, so
  // no predicate per load. A batch full in some of its lanes only goes to the partial path in all
  // of them: split by lane, a warp would run the two paths one after the other, two round trips for
  // one batch ("Long rows").
  const int warp_last = lane | (min(group, 32) - 1);  // the warp's last lane in the group
  for (; v0 - lane + warp_last + (kBatch - 1) * group < end; v0 += kBatch * group, t.u -= kBatch) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) buf[u] = load_vec<kEvictFirst>(body + v0 + u * group);
    tail.ride(v0 - lane, body, tail_slots, lane, group, end);
    pick_target<E>(buf, t, x_t);
    add_batch(buf, 0, kBatch, false);
  }
  // The last batch, partial in some lane of the warp: missing vectors read as -inf, which adds nothing.
  if (v0 < end) {
    const int nvalid = (end - v0 + group - 1) >> group_shift;  // this lane's vectors in the batch
    if (tail.rides) {
      tail.read(buf, tail_slots, v0, group, end, neg_inf);
    } else {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) buf[u] = u < nvalid ? load_vec<kEvictFirst>(body + v0 + u * group) : neg_inf;
    }
    pick_target<E>(buf, t, x_t);
    add_batch(buf, 0, nvalid, true);
  }
  return st;
}

// The group's merged (m, s) and target logit, complete in its leader (lane 0); with label smoothing
// (smooth), its Gap too, each lane's rebased to the merged max. Groups of more than a warp
// meet in shared memory (`state`, and `gap_state` for the gaps: a slot per warp of the CTA): each
// warp leaves its own, and the group's first warp merges them, lane w taking warp w's, in a
// butterfly of log2(warps) levels.
__device__ __forceinline__ void group_merge(Lse& st, float& x_target, int t_lane, int group, int lane, int group_id,
                                            float4* state, bool smooth, Gap& gap, float2* gap_state) {
  const float lane_base = safe_base(st.m);
  if (group <= 32) {
    lse_reduce_lanes(st, group);
    x_target = __shfl_sync(0xffffffffu, x_target, t_lane, group);
    if (smooth) gap = gap_lanes_sum(gap_rebase(gap, lane_base, safe_base(st.m)), group);
    return;
  }
  lse_reduce_lanes(st, 32);
  // Each warp takes the value at the target's lane: 0 except in the warp that read it.
  x_target = __shfl_sync(0xffffffffu, x_target, t_lane & 31);
  const int warp = threadIdx.x >> 5, warps_per_group = group >> 5;
  if (smooth) gap = gap_lanes_sum(gap_rebase(gap, lane_base, safe_base(st.m)), 32);
  if ((threadIdx.x & 31) == 0) {
    state[warp] = make_float4(st.m, st.s, x_target, 0.f);
    if (smooth) gap_state[warp] = make_float2(gap.sum, gap.weight);
  }
  group_barrier(1 + group_id, group);
  if (lane < 32) {
    const int w = threadIdx.x & 31;
    const float4 o = w < warps_per_group ? state[warp + w] : make_float4(-INFINITY, 0.f, 0.f, 0.f);
    st = {o.x, o.y};
    lse_reduce_lanes(st, warps_per_group);
    x_target = lanes_sum(o.z, warps_per_group);  // one warp's is the target logit, the rest +0
    if (smooth) {
      const float2 g = w < warps_per_group ? gap_state[warp + w] : make_float2(0.f, 0.f);
      gap = gap_lanes_sum(gap_rebase({g.x, g.y}, safe_base(o.x), safe_base(st.m)), warps_per_group);
    }
  }
}

// The segment merge, the last CTA's share where rows are split: each row's segments merged, its
// loss, and the rows counted. A slab of rows' (m, s, x_t) partials and their targets come into
// shared memory in one round of loads, then `lanes` threads merge each row: lane l takes segments
// l, l + lanes, ... in order (at most 4 where 32 lanes allow), and a butterfly merges the lanes.
// Merging straight from global memory, a thread per row waited a round trip per segment ("Long
// rows"). The slab is dynamic shared memory, launched only where rows are split, so that the other
// launches keep L1.
template <class E, class Target>
__device__ Total segments_total(const Params& p) {
  extern __shared__ float4 seg_slab[];
  int* const seg_kinds = reinterpret_cast<int*>(seg_slab + kSegSlab);
  const Target* targets = static_cast<const Target*>(p.targets);
  Total total = {0.0, 0.0};
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
    if (int(threadIdx.x) < nrows) seg_kinds[threadIdx.x] = target_kind(p, targets[(r0 + threadIdx.x) * p.target_stride]);
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
      if (row_lane == 0 && r < nrows) {
        const int kind = seg_kinds[r];
        // The column where the options build may need it for the class weight: it is not in the kinds.
        const long long code = kOptions && kind == kTargetCounted ? (long long)targets[(r0 + r) * p.target_stride] : kind;
        const float weight = class_weight<E>(p, code);
        const float loss = row_outcome<E>(p, r0 + r, code, st, x_target, weight);
        if (kind != kTargetIgnored) total = {total.sum + loss, total.divisor + weight};
      }
    }
    __syncthreads();  // every row is merged before the next slab overwrites this one
  }
  return total;
}

template <class E, class Target, bool kEvictFirst, bool kLead256>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_rows_kernel(const Params p) {
  __shared__ float4 warp_state[2][kWarps];     // (m, s, target logit or 0, unused) per warp, by item parity
  __shared__ float2 warp_gaps[2][kOptions ? kWarps : 1];  // label smoothing's Gap per warp, by item parity
  __shared__ float warp_sums[2][kChunkSums];   // loss (and weight) sums per warp, by chunk parity
  __shared__ long long claimed[2];             // the chunk after next, by chunk parity
  __shared__ Total final_scratch[kWarps];
  __shared__ uint4 tail_vecs[kShortTail * kThreads];  // a short last batch: thread t's u-th vector at u * kThreads + t
  __shared__ uint32_t weight_slots[kOptions ? kThreads : 1];  // copy_class_weight's, a slot per thread

  const int group = p.group;
  const int lane = threadIdx.x & (group - 1);
  // group is a power of two: shifts, where a division took some 20 instructions ahead of the first load.
  const int group_shift = __ffs(group) - 1;
  const int group_id = threadIdx.x >> group_shift;
  const int groups = kThreads >> group_shift;
  const int rounds = p.chunk_rounds;
  const bool leader = lane == 0;
  const bool whole_rows = p.splits == 1;  // else segments, with a partial per item
  const Target* targets = static_cast<const Target*>(p.targets);
  const auto* logits = static_cast<const typename E::Storage*>(p.logits);

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
  unsigned int* const claim_counter = p.counter + 1;
  ChunkClaims claims;
  long long next_target = load_target(item_of(claims.chunk, 0));
  unsigned int ignored = 0;  // leaders: the rows of ignore_index they met; the mean divides by the rest
  int item_parity = 0;

  for (int parity = 0; claims.chunk < p.chunks; parity ^= 1) {  // the same in every thread
    const unsigned int claim = claims.claim(claim_counter);
    float loss_sum = 0.f, weight_sum = 0.f;  // leaders: this group's rows of the chunk, in order; 0 elsewhere

    for (int r = 0; r < rounds; ++r, item_parity ^= 1) {
      const long long item = item_of(claims.chunk, r);
      const long long target = next_target;
      next_target = load_target(r + 1 < rounds ? item_of(claims.chunk, r + 1) : item_of(claims.next, 0));
      Lse st = {-INFINITY, 0.f};
      float x_target = 0.f;  // in the lane that read it; stays 0 in segments without the target column
      int t_lane = 0;
      Gap gap = {0.f, 0.f};  // label smoothing's, of the lane's share of the row
      if (leader && whole_rows) copy_class_weight<E>(weight_slots + (kOptions ? threadIdx.x : 0), p, target_code(p, target));
      // Ignored and out-of-range targets need no logits (the row is skipped or yields NaN), unless
      // every row's log-sum-exp is asked for.
      if (item < p.items && ((target >= 0 && target < p.cols) || every_row(p))) {
        const long long row = row_of(item);
        const long long c0 = (item - row * p.splits) * (long long)p.seg_len;
        const auto* seg = logits + row * p.row_stride + c0;
        const int len = int(min((long long)p.seg_len, p.cols - c0));
        const int tcol = target >= c0 && target < c0 + len ? int(target - c0) : -1;
        const ItemGaps gaps = {p, kEvictFirst};
        st = item_lse<E, kEvictFirst, kLead256>(seg, len, lane, group, tcol, tail_vecs + threadIdx.x, x_target, t_lane,
                                                gaps);
        if (gaps.on()) gap = gaps.held();
      }

      group_merge(st, x_target, t_lane, group, lane, group_id, warp_state[item_parity], kEvictFirst && smoothing(p), gap,
                  warp_gaps[item_parity]);
      if (leader && item < p.items) {
        if (!whole_rows) {
          p.seg_partials[item] = make_float4(st.m, st.s, x_target, 0.f);
        } else {
          const long long code = target_code(p, target);
          const float weight = copied_class_weight<E>(weight_slots + (kOptions ? threadIdx.x : 0), p, code);
          const float loss = row_outcome<E>(p, item, code, st, x_target, weight, gap);
          if (target == ignore_index(p)) {
            ++ignored;
          } else {
            loss_sum += loss;
            weight_sum += weight;
          }
        }
      }
    }

    end_chunk(p, whole_rows, loss_sum, weight_sum, group, warp_sums[parity], claims, claim, &claimed[parity]);
    claims.advance(&claimed[parity]);
  }

  if (!arrive_last(p, ignored, whole_rows)) return;
  reset_claims(claim_counter);
  store_result<E>(p, whole_rows ? whole_rows_total(p) : cta_sum(segments_total<E, Target>(p), final_scratch));
}

}  // namespace
