// The exact sum: losses added as integers to a fixed-point number that holds any float.
#pragma once

#include "arch.cuh"

namespace {

// Whole rows: each chunk's loss sum, a float, is added to one fixed-point number by integer atomics.
// A finite float is mant * 2^(at - 149) with mant < 2^24 and 0 <= at <= 253, so its bits fall in
// two neighbouring 32-bit digits of a number whose unit is 2^-149: digit k weighs 2^(32k - 149),
// and kExactDigits of them reach 2^139, past the largest float. Each digit lives in a 64-bit word
// whose upper half takes the carries of up to 2^31 additions, one per chunk (chunks are far fewer:
// each holds 16 KB of logits or 8 rows, or there is one per CTA); a negative addend, a loss rounded
// just under zero, goes in as two's complement. The last CTA propagates the carries. Integer addition
// gives the same bits in any order, so the chunks may land in any order, and the sum is exact until
// it is converted to double; it costs the last CTA 80 bytes, not a partial per chunk
// (docs/design, "The exact sum"). Infinities and NaN set flags in the word after the digits, so
// that the mean follows IEEE rules for them.
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

}  // namespace
