#pragma once
// Weighted sums of matrix rows, the inner product of the fused CPU linear-attention kernels
// (linear_attention_fused.cpp, linrec_fused.cpp). Compiled inside the (baseline or AVX2) function
// that calls it; the loops carry `omp simd`. No Torch headers.
#include <algorithm>
#include <cstdint>

namespace seqrec::ops {

// out[j] = sum_{i < n} w[i] M[i, j] for j < W (M [n x W] row-major): the rows of M weighted by w.
// Rows as narrow as 16 (two AVX2 registers) would make one chain of dependent multiply-adds,
// latency-bound; there four partial sums of every fourth row run side by side.
template <typename T, int kW>
__attribute__((always_inline)) inline void weighted_rows(const T* __restrict__ w, const T* __restrict__ M, int64_t n,
                                                         int64_t W_, T* __restrict__ out) {
  if constexpr (kW > 0 && kW <= 16) {
    T a0[kW], a1[kW], a2[kW], a3[kW];
#pragma omp simd
    for (int64_t j = 0; j < kW; ++j) a0[j] = a1[j] = a2[j] = a3[j] = T(0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const T w0 = w[i], w1 = w[i + 1], w2 = w[i + 2], w3 = w[i + 3];
      const T* __restrict__ r = M + i * kW;
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) {
        a0[j] += w0 * r[j];
        a1[j] += w1 * r[kW + j];
        a2[j] += w2 * r[2 * kW + j];
        a3[j] += w3 * r[3 * kW + j];
      }
    }
    for (; i < n; ++i) {
      const T wi = w[i];
      const T* __restrict__ r = M + i * kW;
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) a0[j] += wi * r[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < kW; ++j) out[j] = (a0[j] + a1[j]) + (a2[j] + a3[j]);
  } else {
    const int64_t W = kW > 0 ? kW : W_;
    std::fill(out, out + W, T(0));
    for (int64_t i = 0; i < n; ++i) {
      const T wi = w[i];
      const T* __restrict__ r = M + i * W;
#pragma omp simd
      for (int64_t j = 0; j < W; ++j) out[j] += wi * r[j];
    }
  }
}

}  // namespace seqrec::ops
