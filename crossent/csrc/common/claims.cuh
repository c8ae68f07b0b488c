// The claim loop: chunks of work taken in order from a counter.
#pragma once

#include "arch.cuh"

namespace {

// CTA b reduces chunks b and gridDim.x + b, then the chunks it claims from a counter, one claim per
// chunk it reduces, made a whole chunk before it is needed. Claiming balances the end: with a fixed
// share each, CTAs on the same tensor finished far apart, since SMs stream at different rates
// (docs/design, "Work balance"). Claims come in order, so the grid still sweeps the tensor front
// to back. Each step of the loop: claim() first, publish() before the step's barrier, advance()
// after it, with the step's parity choosing the shared slot.
struct ChunkClaims {
  long long chunk, next;  // the chunk this step reduces, and the one after it

  __device__ __forceinline__ ChunkClaims() : chunk(blockIdx.x), next((long long)gridDim.x + blockIdx.x) {}
  // This step's claim, in thread 0 (0 elsewhere). counter: the chunks claimed so far, Params::counter[1].
  __device__ __forceinline__ unsigned int claim(unsigned int* counter) const {
    unsigned int mine = 0u;
    if (threadIdx.x == 0) mine = atomicAdd(counter, 1u);
    return mine;
  }
  __device__ __forceinline__ void publish(long long* slot, unsigned int mine) const {
    if (threadIdx.x == 0) *slot = 2ll * gridDim.x + mine;
  }
  __device__ __forceinline__ void advance(const long long* slot) {
    chunk = next;
    next = *slot;
  }
};

// By the last CTA, after every claim: the claims' counter back at zero for the next launch.
__device__ __forceinline__ void reset_claims(unsigned int* counter) {
  if (threadIdx.x == 0) *counter = 0;
}

}  // namespace
