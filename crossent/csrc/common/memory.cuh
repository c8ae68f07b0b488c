// Loads: 16-byte global loads, copies into shared memory, and a row cut at 16-byte boundaries.
#pragma once

#include "formats.cuh"

namespace {

// A 16-byte global load, plain or evict-first (ld.global.cs: L2 replaces the line before any
// other, so the rest of L2 stays). When each pays off is the host's policy._evict_first. A compile-time
// choice: at run time it cost registers and time (docs/design, "Loads").
template <bool kEvictFirst>
__device__ __forceinline__ uint4 load_vec(const uint4* p) {
  if constexpr (kEvictFirst) return __ldcs(p);
  else return *p;
}

// A 16-byte copy from global to shared memory that holds no register while in flight (cp.async),
// evict-first in L2 where the loads are; and the wait for all of a thread's copies. Before sm_80,
// which has no cp.async, a load and a store: only the thread that copies reads the copy.
template <bool kEvictFirst>
__device__ __forceinline__ void copy_vec_async(uint4* dst, const uint4* src) {
#if __CUDA_ARCH__ >= 800
  const unsigned int to = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
  if constexpr (kEvictFirst) {
    asm volatile("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n\t"
                 "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, policy;\n\t}" :: "r"(to), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(to), "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
  *dst = load_vec<kEvictFirst>(src);
#endif
}
__device__ __forceinline__ void wait_copies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// The same for a word of 8 or 16 bytes, plain, and its copies counted in groups: commit_copies
// closes a group, wait_copies_but<n> waits until at most the latest n groups are in flight.
template <class T>
__device__ __forceinline__ void copy_async(T* dst, const T* src) {
  static_assert(sizeof(T) == 8 || sizeof(T) == 16, "a quad: 8 or 16 bytes");
#if __CUDA_ARCH__ >= 800
  const unsigned int to = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(to), "l"(src), "n"(int(sizeof(T))) : "memory");
#else
  *dst = *src;
#endif
}
[[maybe_unused]] __device__ __forceinline__ void commit_copies() {  // (the default build has no use for it)
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait_copies_but() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
#endif
}

// A 16-byte store to a shared-memory address held in one 32-bit register: through a generic
// pointer the compiler rebuilt the shared window's address before each predicated store.
__device__ __forceinline__ void store_shared(uint32_t address, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// A stretch of `len` elements cut at 16-byte boundaries: `head` elements before the first
// boundary, then `nvec` whole vectors, then fewer than kPerVec elements after them. The elements
// outside the whole vectors are its edges, numbered 0, 1, ...: the head, then what follows the
// vectors; edge_element gives edge k's place in the stretch, edge_number the inverse.
struct Aligned {
  int head, nvec;
};
template <class E>
__device__ __forceinline__ Aligned align_stretch(const typename E::Storage* p, int len) {
  const int misalign = int(reinterpret_cast<uintptr_t>(p) & 15) / int(sizeof(typename E::Storage));
  const int head = min(misalign ? E::kPerVec - misalign : 0, len);
  return {head, (len - head) / E::kPerVec};
}
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

}  // namespace
