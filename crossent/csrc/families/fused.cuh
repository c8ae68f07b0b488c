// Family: loss and gradient fused (the options build).
#pragma once

#include "../common/cluster.cuh"
#include "gradient.cuh"

namespace {

// Training's forward, where the logits require grad and are contiguous rows of class indices that fit
// the registers of a CTA, or from sm_90 on of a thread-block cluster (kClustered: up to
// kFusedClusterCtas CTAs, equal shares of the row, each copied into shared memory by TMA while the row
// before it is reduced, their (m, s) exchanged through distributed shared memory): each row is loaded
// once into the registers of its group (`group` lanes, a power of two from half a warp (a quarter for
// float32) to the CTA, kFusedVecs 16-byte vectors a lane at most and an edge element), reduced there
// to its (m, s) and Gap, which every lane of the group then holds, and from the same
// registers come its loss (summed as every family sums, to the exact sum) and its gradient, by the
// gradient's formula (above) with g the loss's gradient as returned: one over the mean's divisor,
// counted on the device just before (cross_entropy_divisor_kernel; null: 1, for the sum and none), and
// l z-loss's 2 z g lse. The logits are read once and the gradient written once. The backward then
// leaves every row whose incoming gradient is 1 as it is (the gradient kernel's Params::grad_in).
// The row's writes follow its reads in every lane (the merge orders them across lanes), so the
// gradient may be written over the logits. Overlap comes from the CTAs an SM holds: while one
// reduces, the others' loads are in flight; and in a cluster, whose CTAs wait for each other every
// row, from the next share's copy, in flight through the wait.

// (m, s) and Gap merged from n shares (n a power of two, at most 32), share(i) a float4 (m, s, Gap):
// each lane loads share(lane mod n), and butterflies over n lanes merge them, so that every lane
// holds the same bits: one load a lane, where a loop over the shares waits on each load in turn.
template <class Share>
__device__ __forceinline__ void merge_shares(Lse& st, Gap& gap, bool smooth, int n, Share share) {
  const float4 o = share(int(threadIdx.x) & (n - 1));
  st = {o.x, o.y};
  lse_reduce_lanes(st, n);
  if (smooth) gap = gap_lanes_sum(gap_rebase({o.z, o.w}, safe_base(o.x), safe_base(st.m)), n);
}

// The merged (m, s) and Gap of `group` lanes, in every lane: within a warp by butterflies, across
// warps through a float4 per warp in `state`, which each warp of the group merges (merge_shares);
// where a cluster's `ctas` CTAs hold the row, across them through `cta_states`, a float4 per CTA,
// which each CTA stores into every CTA's, counted on `arrivals` (the row's `phase` of it).
// (Unused where the build has no fused family.)
[[maybe_unused]] __device__ __forceinline__ void group_share(Lse& st, Gap& gap, bool smooth, int group, int group_id,
                                                             float4* state, int ctas, float4* cta_states,
                                                             uint64_t* arrivals, unsigned int phase) {
  const float lane_base = safe_base(st.m);
  const int width = min(group, 32);
  lse_reduce_lanes(st, width);
  if (smooth) gap = gap_lanes_sum(gap_rebase(gap, lane_base, safe_base(st.m)), width);
  if (group <= 32) {  // the leader's load of the target's logit before the other lanes' gradient, which
    __syncwarp();     // may be written over the logits (as the barriers below order it for larger groups)
    return;
  }
  const int warp = threadIdx.x >> 5, first = warp & ~((group >> 5) - 1);
  if ((threadIdx.x & 31) == 0) state[warp] = make_float4(st.m, st.s, gap.sum, gap.weight);
  group_barrier(1 + group_id, group);
  merge_shares(st, gap, smooth, group >> 5, [&](int w) { return state[first + w]; });
  if (ctas == 1) return;
  if (threadIdx.x < ctas)
    store_to_peer(&cta_states[cluster_rank()], threadIdx.x, make_float4(st.m, st.s, gap.sum, gap.weight), arrivals);
  wait_arrivals(arrivals, phase);
  merge_shares(st, gap, smooth, ctas, [&](int rank) { return cta_states[rank]; });
}

template <class L, bool kClustered>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_fused_kernel(const Params p) {
  constexpr int kVecs = kSm75 ? kFusedVecs / 2 : kFusedVecs;  // sm_75's emulated bf16 spilled at kFusedVecs
  using S = typename L::Storage;
  __shared__ float4 warp_state[2][kWarps];  // group_share's, by chunk parity
  __shared__ float4 cta_states[2][kFusedClusterCtas];  // ... and where a cluster holds the row, its CTAs'
  __shared__ float warp_sums[2][kChunkSums];
  __shared__ long long claimed[2], cluster_claimed[2];
  __shared__ uint64_t arrivals[2];  // where a cluster holds the row: its CTAs' shares and claim, counted
  __shared__ uint64_t share_loaded;  // ... and the bulk copy of this CTA's share of the row, into:
  extern __shared__ uint4 dynamic_smem[];  // kThreads * kVecs vectors (launch_fused_cluster)
  // `group` lanes of a CTA take a row, from a few to the CTA; kClustered, each of a cluster's `ctas`
  // CTAs takes an equal share of the row's vectors, in the order of their ranks (no CTA waits on a
  // fuller one), and a chunk is a row. (An instance of its own: the cluster's variables cost the
  // CTA's rows registers they did not have.)
  const int group = kClustered ? kThreads : p.group, lane = threadIdx.x & (group - 1);
  const int group_id = kClustered ? 0 : threadIdx.x / group, ctas = kClustered ? p.group / kThreads : 1;
  const bool first_cta = cluster_rank() == 0, leader = lane == 0 && first_cta;  // leader: the row's first lane
  const int cols = int(p.cols);
  const bool smooth = smoothing(p), class_weights = weighted(p) && smooth;  // where a share reads w_j
  auto row_of = [&](long long chunk) { return chunk * (kThreads / group) + group_id; };
  auto load_target = [&](long long chunk) {  // a chunk ahead, so that no row waits on its target
    const long long row = row_of(chunk);
    return row < p.rows ? load_target_words(p, row) : TargetWords{0u, 0u};
  };
  const S* logits = static_cast<const S*>(p.logits);
  // The vectors of a row (its `whole`) that this CTA holds: all of them, or in a cluster this CTA's
  // equal share, in rank order (no CTA waits on a fuller one; none past the row's).
  auto share_of = [&](Aligned whole) {
    if (!kClustered) return whole;
    const int share = (whole.nvec + ctas - 1) / ctas, first = int(cluster_rank()) * share;
    return Aligned{whole.head + first * L::kPerVec, max(0, min(share, whole.nvec - first))};
  };
  // kClustered: a row's share is copied into shared memory (TMA) while the row before it is reduced,
  // so that the CTA has loads in flight through the cluster's exchange; thread 0 sends for each chunk.
  auto load_share = [&](long long chunk) {
    const long long row = row_of(chunk);
    const S* x_row = logits + row * p.row_stride;
    const Aligned cut = share_of(row < p.rows ? align_stretch<L>(x_row, cols) : Aligned{0, 0});
    expect_bytes(&share_loaded, cut.nvec * sizeof(uint4));
    if (cut.nvec > 0) load_to_shared(dynamic_smem, x_row + cut.head, cut.nvec * sizeof(uint4), &share_loaded);
  };
  ChunkClaims claims;
  if (kClustered) {  // the cluster is the claiming unit: its first CTA claims, each CTA reads the claim there
    claims.chunk = cluster_index();
    claims.next = cluster_count() + claims.chunk;
    if (threadIdx.x == 0) init_arrivals(&arrivals[0]), init_arrivals(&arrivals[1]), init_arrivals(&share_loaded);
    cluster_barrier();
    if (threadIdx.x == 0) load_share(claims.chunk);
  }
  TargetWords next_target = load_target(claims.chunk);
  unsigned int ignored = 0;  // group leaders: the rows of ignore_index they met

  for (unsigned int step = 0; claims.chunk < p.chunks; ++step) {  // the same in every thread
    // Shared slots by the step's parity; an arrivals barrier's phase flips each second step.
    const int parity = step & 1;
    if (kClustered && threadIdx.x == 0) expect_bytes(&arrivals[parity], ctas * sizeof(float4) + sizeof(long long));
    const unsigned int claim = first_cta ? claims.claim(p.counter + 1) : 0u;
    const long long row = row_of(claims.chunk);
    const bool live = row < p.rows;
    const TargetWords target = next_target;
    next_target = load_target(claims.next);
    const long long code = live ? target_code(p, target_value(p, target)) : kTargetIgnored;
    const S* x_row = logits + row * p.row_stride;
    S* dx_row = static_cast<S*>(p.grad) + row * p.grad_row_stride;
    const Aligned whole = live ? align_stretch<L>(x_row, cols) : Aligned{0, 0};
    const int nedge = live && first_cta ? cols - whole.nvec * L::kPerVec : 0;  // fewer than 2 kPerVec: one a lane
    const int edge = lane < nedge ? edge_element<L>(whole, lane) : -1;
    const Aligned cut = share_of(whole);
    // The row: every load issued before any is used; in a cluster, from the share's copy, whose
    // memory then takes the next chunk's.
    const uint4* x_vecs = kClustered ? dynamic_smem : reinterpret_cast<const uint4*>(x_row + cut.head);
    if (kClustered) wait_arrivals(&share_loaded, step & 1);
    const uint4 neg_inf = neg_inf_vec<L>();
    uint4 xb[kVecs];
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int v = lane + u * group;
      xb[u] = v < cut.nvec ? x_vecs[v] : neg_inf;
    }
    if (kClustered) {
      __syncthreads();
      if (threadIdx.x == 0) load_share(claims.next);
    }
    const float x_edge = edge >= 0 ? load_scalar<L>(x_row + edge) : -INFINITY;  // as loaded: the gradient caps it
    float x_t = 0.f;
    if (leader && code >= 0) x_t = logit<L>(p, load_scalar<L>(x_row + code));
    // The lane whose vectors hold the target, and the target's logit as loaded (the gradient's fix-up).
    const bool owner = holds_target<L>(int(code), cut, group, lane);
    const float x_own = owner ? L::value(x_row[code]) : 0.f;  // not __ldg's: this thread's store to it follows
    // The claim, into each CTA's shared memory, there after group_share's wait. Sent behind the row's
    // loads: it waits for the claim's atomic, and nothing of the leader's may pass it.
    if (kClustered && leader)
      for (int rank = 0; rank < ctas; ++rank)
        store_to_peer(&cluster_claimed[parity], rank, 2ll * cluster_count() + claim, &arrivals[parity]);

    // The lane's (m, s) and Gap against its own max, then the group's.
    // The cap rises with x: the capped max is the raw max capped.
    const float m = fmaxf(logit<L>(p, vectors_max<L>(xb)), edge >= 0 ? logit<L>(p, x_edge) : -INFINITY);
    const float base = safe_base(m);
    float s = 0.f;
    Gap gap = {0.f, 0.f};
    // Each class's weight from weight(column). Where no class weight is read, a loop of its own: the
    // test inside cost every element the weight's instructions. Not for soft-capped logits, whose
    // elements take their time in the cap, and whose second copy of the loop ran out of registers.
    const auto weight_of = [&](int col) { return class_weights ? weight_at<L>(p, col) : 1.f; };
    const auto no_weight = [](int) { return 1.f; };
    const bool weightless = !class_weights && !kSoftCapped<L>;
    auto add_exps = [&](auto weight) {
#pragma unroll
      for (int u = 0; u < kVecs; ++u)
        if (lane + u * group < cut.nvec)
#pragma unroll
          for (int i = 0; i < L::kPerVec; ++i)
            exp_and_gap(logit<L>(p, L::at(xb[u], i)), base, weight(cut.head + (lane + u * group) * L::kPerVec + i), s,
                        gap);
    };
    if (!smooth && !kSoftCapped<L>) s = vectors_sum_exp<L>(xb, base, 0.f);  // vectors past the row: -inf, adding 0
    else if (weightless) add_exps(no_weight);
    else add_exps(weight_of);
    if (edge >= 0) exp_and_gap(logit<L>(p, x_edge), base, weight_of(edge), s, gap);
    Lse st = {m, s};
    group_share(st, gap, smooth, group, group_id, warp_state[parity], ctas, cta_states[parity], &arrivals[parity],
                step >> 1 & 1);

    // The target's class weight, every lane's (the gradient's target share reads it): loaded here,
    // where it holds no register while the row is reduced.
    const float w_t = class_weight<L>(p, code);

    // The loss, in the group's leader, as every family finishes a row.
    float loss = 0.f, weight = 0.f;
    if (live && leader) count_row(code, row_outcome<L>(p, row, code, st, x_t, w_t, gap), w_t, loss, weight, ignored);

    // The gradient, from the registers (the gradient kernel's factors, with g and l as above). Every
    // vector's elements are written as classes other than the target (other_class_gradient's one FMA
    // where no class weight is read); the lane whose vector holds the target then writes that element
    // again, from x_own (loaded with the row: in place, the vector's store overwrites it): one store
    // more a row, where a test in every vector cost its selects.
    // g and the weights' sum, loaded again for each row (from L1): held across the loop, one spilled.
    const float g = p.grad_out ? __ldg(static_cast<const float*>(p.grad_out)) : 1.f;  // the divisor kernel's
    const float all_weights = class_weights ? __ldg(p.weight_total) : float(p.cols);
    const RowGradient r = class_row_gradient(p, make_float2(st.m, st.s), code, w_t, g, 0.f, all_weights, class_weights);
    uint4* dx_vecs = reinterpret_cast<uint4*>(dx_row + cut.head);
    auto store_vectors = [&](auto dx_of) {
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int v = lane + u * group;
        if (v < cut.nvec) {
          float dx[L::kPerVec];
#pragma unroll
          for (int i = 0; i < L::kPerVec; ++i) dx[i] = dx_of(L::at(xb[u], i), cut.head + v * L::kPerVec + i);
          dx_vecs[v] = vector_of<L>(dx);
        }
      }
    };
    float unused;
    if (weightless && !r.zero) {
      store_vectors([&](float x, int) { return other_class_gradient(r, x); });
    } else {
      store_vectors([&](float x, int col) {
        return element_gradient<L, false>(p, r, x, weight_of(col), 0.f, false, unused);
      });
    }
    if (owner) L::store(dx_row + code, element_gradient<L, false>(p, r, x_own, w_t, 0.f, true, unused));
    if (edge >= 0)
      L::store(dx_row + edge, weightless && !r.zero && edge != r.target
                                  ? other_class_gradient(r, x_edge)
                                  : element_gradient<L, false>(p, r, x_edge, weight_of(edge), 0.f, edge == r.target,
                                                               unused));
    end_chunk(p, true, loss, weight, group, warp_sums[parity], claims, kClustered ? 0u : claim, &claimed[parity]);
    claims.advance(kClustered ? &cluster_claimed[parity] : &claimed[parity]);
  }

  if (!arrive_last(p, ignored, true)) return;
  reset_claims(p.counter + 1);
  store_result<L>(p, whole_rows_total(p));
}


// Ahead of a fused launch of the mean, in the same stream: its divisor, the rows counted or their
// classes' weights, counted as the forward's last CTA counts them (the rows of ignore_index, and the
// weights' exact sum, here of each CTA's sum), and 1 / divisor stored at Params::grad_out, where the
// fused kernel reads its g. One small launch in place of the several that torch operations took, whose
// host time showed in the step. The workspace is left at zero, as by every launch.
template <class E>
__global__ void __launch_bounds__(kThreads, kResidentCtas) cross_entropy_divisor_kernel(const Params p) {
  __shared__ Total scratch[kWarps];
  Total mine = {0.0, 0.0};  // (rows of ignore_index, the other rows' class weights)
  for (long long row = (long long)blockIdx.x * kThreads + threadIdx.x; row < p.rows;
       row += (long long)gridDim.x * kThreads) {
    const long long code = target_code(p, target_value(p, load_target_words(p, row)));
    if (code == kTargetIgnored) mine.sum += 1.0;
    else mine.divisor += class_weight<E>(p, code);
  }
  const Total cta = cta_sum(mine, scratch);
  if (threadIdx.x == 0) {
    if (cta.sum != 0.0) atomicAdd(p.ignored_rows, (unsigned long long)cta.sum);
    if (weighted(p)) exact_add(p.weight_exact, float(cta.divisor));
  }
  if (!arrive_last(p, 0u, true)) return;
  const Total total = whole_rows_total(p);
  if (threadIdx.x == 0) {
    *p.ignored_rows = 0;
    *static_cast<float*>(p.grad_out) = float(1.0 / total.divisor);
  }
}



// Rows longer than a CTA holds: clusters of p.group / kThreads CTAs, past the portable 8 where the
// host's policy allows it. Not for soft-capped logits: the cap's arithmetic left the cluster's
// instance a register short. A failed call leaves its error to cudaGetLastError.
template <class E>
void launch_fused_cluster(const Params& p) {
  const unsigned int ctas = p.group / kThreads;
  if (ctas > 8) cudaFuncSetAttribute(cross_entropy_fused_kernel<E, true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = ctas;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(p.grid);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kThreads * kFusedVecs * sizeof(uint4);  // a share of the row, copied ahead
  config.stream = p.stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, cross_entropy_fused_kernel<E, true>, p);
}

template <class E>
void launch_fused(const Params& p) {
  if (p.reduction == kReductionMean) {
    const long long blocks = (p.rows + kThreads - 1) / kThreads;  // at least one: no rows, and the divisor is 0
    cross_entropy_divisor_kernel<E><<<int(blocks < 1 ? 1 : blocks < p.grid ? blocks : p.grid), kThreads, 0, p.stream>>>(p);
  }
  if (p.softcap != 0.f) cross_entropy_fused_kernel<SoftCapped<E>, false><<<p.grid, kThreads, 0, p.stream>>>(p);
  else if (p.group > kThreads) launch_fused_cluster<E>(p);
  else cross_entropy_fused_kernel<E, false><<<p.grid, kThreads, 0, p.stream>>>(p);
}

}  // namespace
