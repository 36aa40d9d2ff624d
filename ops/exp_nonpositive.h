#pragma once
// exp(x) for x <= 0 in float without branches or calls, so that a loop around it vectorises
// (the fused LinRec kernel's ELU): Cephes' reduction x = n·ln 2 + r with |r| <= ln 2 / 2, a
// polynomial for exp(r), and 2^n built in the exponent bits. Within 2 ulp of std::exp down to
// -87 (tests/ops/test_linear_attention.cpp); below -87 it returns exp(-87), so that 2^n stays a
// normal number (ELU's exp(x) - 1 is -1 there to float precision). The double overload is
// std::exp. detail::exp_nonpositive_of also takes a GCC vector of floats (the interest scan's
// CPU groups), lane by lane the same operations. No Torch headers.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace seqrec::ops {

namespace detail {

// 2^n for an integer-valued n (|n| <= 126), built in the exponent bits.
__attribute__((always_inline)) inline float pow2_of(float n) {
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale;
}
#if !defined(__CUDACC__)
// The same for each lane of a GCC vector of floats.
template <typename V>
__attribute__((always_inline)) inline V pow2_of(V n) {
  typedef int32_t I __attribute__((vector_size(sizeof(V))));
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale;
}
#endif

// The polynomial, for a float or (host compilers) each lane of a GCC vector of floats: the same
// operations either way, so a vector's lanes equal the scalar's results bit for bit.
template <typename V>
__attribute__((always_inline)) inline V exp_nonpositive_of(V x) {
  x = x < -87.0f ? V{} - 87.0f : x;  // (std::max and std::floor keep GCC from vectorising)
  // n = x / ln 2 rounded to the nearest integer by the 1.5·2^23 shift (|n| <= 126).
  constexpr float kShift = 12582912.0f;
  const V n = (x * 1.44269504088896341f + kShift) - kShift;
  const V r = x - n * 0.693359375f + n * 2.12194440e-4f;
  V y = V{} + 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  return y * pow2_of(n);
}

}  // namespace detail

__attribute__((always_inline)) inline float exp_nonpositive(float x) { return detail::exp_nonpositive_of(x); }

__attribute__((always_inline)) inline double exp_nonpositive(double x) { return std::exp(x); }

}  // namespace seqrec::ops
