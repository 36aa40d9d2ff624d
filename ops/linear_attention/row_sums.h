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

// outs[r][j] = sum_{i < n} ws[r][i] M[i, j] for r < 4, j < W: four weight rows against one M,
// so that each row of M is read once for all four (one weight row at a time, a product with a
// matrix in L1 is bound by its loads: one per multiply-add). At widths up to 16 the four sums
// are eight (AVX2) or four (AVX-512) independent chains; wider rows take weighted_rows per row.
template <typename T, int kW>
__attribute__((always_inline)) inline void weighted_rows4(const T* const* ws, const T* __restrict__ M, int64_t n,
                                                          int64_t W_, T* const* outs) {
  if constexpr (kW > 0 && kW <= 16) {
    T a0[kW], a1[kW], a2[kW], a3[kW];
#pragma omp simd
    for (int64_t j = 0; j < kW; ++j) a0[j] = a1[j] = a2[j] = a3[j] = T(0);
    const T *__restrict__ w0 = ws[0], *__restrict__ w1 = ws[1], *__restrict__ w2 = ws[2], *__restrict__ w3 = ws[3];
    for (int64_t i = 0; i < n; ++i) {
      const T x0 = w0[i], x1 = w1[i], x2 = w2[i], x3 = w3[i];
      const T* __restrict__ r = M + i * kW;
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) {
        const T m = r[j];
        a0[j] += x0 * m;
        a1[j] += x1 * m;
        a2[j] += x2 * m;
        a3[j] += x3 * m;
      }
    }
    T *__restrict__ o0 = outs[0], *__restrict__ o1 = outs[1], *__restrict__ o2 = outs[2], *__restrict__ o3 = outs[3];
#pragma omp simd
    for (int64_t j = 0; j < kW; ++j) {
      o0[j] = a0[j];
      o1[j] = a1[j];
      o2[j] = a2[j];
      o3[j] = a3[j];
    }
  } else {
    for (int r = 0; r < 4; ++r) weighted_rows<T, kW>(ws[r], M, n, W_, outs[r]);
  }
}

// M[i, j] += sum_{r < 4} as[r][i] bs[r][j] for i < n, j < W (M [n x W] row-major): four rank-1
// updates in one pass over M, which one update per pass would load and store four times.
template <typename T, int kW>
__attribute__((always_inline)) inline void add_outer4(T* __restrict__ M, const T* const* as, const T* const* bs,
                                                      int64_t n, int64_t W_) {
  const int64_t W = kW > 0 ? kW : W_;
  const T *__restrict__ a0 = as[0], *__restrict__ a1 = as[1], *__restrict__ a2 = as[2], *__restrict__ a3 = as[3];
  const T *__restrict__ b0 = bs[0], *__restrict__ b1 = bs[1], *__restrict__ b2 = bs[2], *__restrict__ b3 = bs[3];
  for (int64_t i = 0; i < n; ++i) {
    const T x0 = a0[i], x1 = a1[i], x2 = a2[i], x3 = a3[i];
    T* __restrict__ row = M + i * W;
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) row[j] += (x0 * b0[j] + x1 * b1[j]) + (x2 * b2[j] + x3 * b3[j]);
  }
}

// M[i, j] += a[i] b[j]: one rank-1 update (outer_sum's per slot; a group's last rows in linrec_fused.cpp).
template <typename T, int kW>
__attribute__((always_inline)) inline void add_outer(T* __restrict__ M, const T* __restrict__ a,
                                                     const T* __restrict__ b, int64_t n, int64_t W_) {
  const int64_t W = kW > 0 ? kW : W_;
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i];
    T* __restrict__ row = M + i * W;
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) row[j] += x * b[j];
  }
}

}  // namespace seqrec::ops
