#pragma once
// bfloat16 as the fused CPU kernels load and store it: raw 16-bit patterns (a tensor's
// at::BFloat16 storage seen as uint16_t), widened and rounded in registers. No Torch headers.
#include <cstdint>
#include <cstring>

namespace seqrec::ops {

// Exact: a bfloat16 is a float32 with the low 16 bits of its mantissa zero.
__attribute__((always_inline)) inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, NaN to the quiet NaN: c10::BFloat16's rounding (a cast's).
__attribute__((always_inline)) inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

}  // namespace seqrec::ops
