// Element formats: float32, bfloat16 and float16 words of a 16-byte vector, as floats.
#pragma once

#include "arch.cuh"

namespace {

// Each format turns the words of a 16-byte vector, or one stored element, into floats, and stores
// the result. Conversions are spelled in PTX so the file needs no fp16 headers; what sm_75 lacks
// (bf16 conversion, the packed max) in plain integer and float operations. A Pair is two
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
  static constexpr bool kPackedMax = true;  // max2 of a word is fmaxf
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
  __device__ static void store(void* out, float v) { *static_cast<Storage*>(out) = Format::bits(v); }
};

struct BF16 : Packed16<BF16> {
  static constexpr uint32_t kNegInfWord = 0xff80ff80u;
#if __CUDA_ARCH__ >= 800
  static constexpr bool kPackedMax = true;
#else
  static constexpr bool kPackedMax = false;  // max2 takes seven instructions
#endif
  __device__ static uint32_t max2(uint32_t a, uint32_t b) {
#if __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else  // the max of each half as floats, whose high halves are the bf16 bits
    return __byte_perm(__float_as_uint(fmaxf(low(a), low(b))), __float_as_uint(fmaxf(high(a), high(b))), 0x7632);
#endif
  }
  __device__ static float value(Storage x) { return __uint_as_float(uint32_t(x) << 16); }
  __device__ static Storage bits(float v) {  // v rounded to nearest even; NaN stays NaN
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#else
    const uint32_t u = __float_as_uint(v);
    return v != v ? Storage(0x7fff) : Storage((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  }
};

struct F16 : Packed16<F16> {
  static constexpr uint32_t kNegInfWord = 0xfc00fc00u;
  static constexpr bool kPackedMax = true;  // before sm_80, two instructions
  __device__ static uint32_t max2(uint32_t a, uint32_t b) {
#if __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else  // a packed compare (sm_53) and a select: a NaN element may lose, and still reaches the sum of exp
    uint32_t a_greater;
    asm("set.gt.u32.f16x2 %0, %1, %2;" : "=r"(a_greater) : "r"(a), "r"(b));
    return (a & a_greater) | (b & ~a_greater);
#endif
  }
  __device__ static float value(Storage x) { return half_bits_to_float(x); }
  __device__ static Storage bits(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
};

// kPerVec floats as one 16-byte vector of E, each rounded once.
template <class E>
__device__ __forceinline__ uint4 vector_of(const float (&v)[E::kPerVec]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (E::kPerVec == 4) w[k] = __float_as_uint(v[k]);
    else w[k] = uint32_t(E::bits(v[2 * k])) | uint32_t(E::bits(v[2 * k + 1])) << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One scalar from global memory, as a float.
template <class E>
__device__ __forceinline__ float load_scalar(const typename E::Storage* p) { return E::value(__ldg(p)); }

// Element i of an array of kFloat32, kBFloat16 or kFloat16 (`dtype`), as a float.
__device__ __forceinline__ float scalar_of(int dtype, const void* p, long long i) {
  if (dtype == kBFloat16) return load_scalar<BF16>(static_cast<const BF16::Storage*>(p) + i);
  if (dtype == kFloat16) return load_scalar<F16>(static_cast<const F16::Storage*>(p) + i);
  return load_scalar<F32>(static_cast<const float*>(p) + i);
}

// All -inf in every element: what a vector past the end of a row reads as, adding exp(-inf) = 0.
template <class E>
__device__ __forceinline__ uint4 neg_inf_vec() {
  return make_uint4(E::kNegInfWord, E::kNegInfWord, E::kNegInfWord, E::kNegInfWord);
}

}  // namespace
