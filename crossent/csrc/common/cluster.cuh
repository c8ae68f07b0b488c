// Thread-block clusters (sm_90 on): ranks, barriers, and stores into peers' shared memory counted on arrival.
#pragma once

#include "arch.cuh"

namespace {

// A thread-block cluster (sm_90 on): the CTA's rank in it, the cluster's place in the grid and the
// grid's clusters, and the barrier of all its threads. Outside a cluster launch each CTA is a cluster
// of one; before sm_90 no kernel reaches these. (Unused where the build has no fused family.)
[[maybe_unused]] __device__ __forceinline__ unsigned int cluster_rank() {
  unsigned int rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
  return rank;
}
[[maybe_unused]] __device__ __forceinline__ unsigned int cluster_index() {
  unsigned int index = blockIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(index));
#endif
  return index;
}
[[maybe_unused]] __device__ __forceinline__ unsigned int cluster_count() {
  unsigned int count = gridDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%nclusterid.x;" : "=r"(count));
#endif
  return count;
}
[[maybe_unused]] __device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Stores into peers' shared memory, counted on arrival: a CTA's `arrivals` barrier (an mbarrier of one
// arrival) expects a phase's bytes, each peer's store (st.async) counts its own off as it lands, and
// the CTA's threads wait for the phase to complete (acquiring, at the cluster's scope, what the peers'
// stores released there). A cluster barrier a row would cost more: its release waits for every store
// the thread has in flight to global memory (MEMBAR.GPU), the gradient's.
[[maybe_unused]] __device__ __forceinline__ uint32_t shared_address(const void* shared) {
  return uint32_t(__cvta_generic_to_shared(shared));
}
[[maybe_unused]] __device__ __forceinline__ uint32_t peer_address(const void* shared, unsigned int rank) {
  uint32_t peer = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(shared_address(shared)), "r"(rank));
#endif
  return peer;
}
// Then a cluster barrier, before any peer stores.
[[maybe_unused]] __device__ __forceinline__ void init_arrivals(uint64_t* arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(shared_address(arrivals))
               : "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void expect_bytes(uint64_t* arrivals, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n\t}"
               ::"r"(shared_address(arrivals)), "r"(bytes) : "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void store_to_peer(float4* shared, unsigned int rank, float4 v,
                                                               uint64_t* arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(peer_address(shared, rank)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(peer_address(arrivals, rank))
               : "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void store_to_peer(long long* shared, unsigned int rank, long long v,
                                                               uint64_t* arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
               ::"r"(peer_address(shared, rank)), "l"(v), "r"(peer_address(arrivals, rank)) : "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void wait_arrivals(uint64_t* arrivals, unsigned int phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n\t.reg .pred done;\n\tWAIT_%=:\n\t"
               "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t@!done bra WAIT_%=;\n\t}"
               ::"r"(shared_address(arrivals)), "r"(phase) : "memory");
#endif
}
// A bulk copy (TMA) of `bytes` (a multiple of 16, from a 16-byte boundary) into this CTA's shared
// memory, counted on `arrivals` as the peers' stores are; the proxy fence first orders the CTA's
// earlier reads of that memory before the copy's writes.
[[maybe_unused]] __device__ __forceinline__ void load_to_shared(void* shared, const void* global, uint32_t bytes,
                                                                uint64_t* arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n\t"
               "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(shared_address(shared)), "l"(global), "r"(bytes), "r"(shared_address(arrivals)) : "memory");
#endif
}

}  // namespace
