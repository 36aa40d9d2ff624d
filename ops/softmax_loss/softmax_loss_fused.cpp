// The softmax loss's row passes on the CPU (softmax_loss_rows.h): one row at a time, so that a
// row of a large catalogue (ML-1M's 3,417 items: 13.7 KB of float) is read from memory once and
// its max, exp-and-sum and scale passes run in the cache. Rows spread over the threads.
#include "ops/softmax_loss/softmax_loss_rows.h"

#include "ops/cpu_features.h"
#include "ops/exp_nonpositive.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace seqrec::ops::detail {
namespace {

// Rows per task: about 32K elements, so that small chunks stay on one thread.
int64_t grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(cols, 1)); }

// x[j] = exp(x[j] - mx), 0 where x[j] is -inf; returns their sum.
template <typename T>
__attribute__((always_inline)) inline T exp_shifted(T* __restrict__ x, int64_t C, T mx) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < C; ++j) {
    const T e = exp_nonpositive(x[j] - mx);
    x[j] = x[j] == kNegInf ? T(0) : e;
    sum += x[j];
  }
  return sum;
}

// Rows [r0, r1) of x [n, C] into their softmax; norm [n, 2] gets each row's max and sum.
template <typename T>
inline void softmax_rows_any(T* x, T* norm, int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* __restrict__ row = x + r * C;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < C; ++j) mx = row[j] > mx ? row[j] : mx;  // (std::max keeps it scalar)
    const T sum = exp_shifted(row, C, mx);
    const T inv = T(1) / sum;
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) row[j] *= inv;
    norm[2 * r] = mx;
    norm[2 * r + 1] = sum;
  }
}

// Rows [r0, r1) into (p - onehot(target)) · g; p recomputed from the rows' logits and norm when
// norm is not null, with the same roundings as softmax_rows_any (this file compiles without
// floating-point contraction, so no FMA makes a vector lane differ from a scalar one).
template <typename T>
inline void softmax_grad_rows_any(T* x, const T* norm, const int64_t* targets, T g, int64_t C, int64_t r0,
                                  int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* __restrict__ row = x + r * C;
    if (norm != nullptr) {
      exp_shifted(row, C, norm[2 * r]);
      const T inv = T(1) / norm[2 * r + 1];
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) row[j] *= inv;
    }
    const int64_t t = targets[r];
    const T pt = row[t];
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) row[j] *= g;
    row[t] = (pt - T(1)) * g;
  }
}

template <typename T>
void softmax_rows_base(T* x, T* norm, int64_t C, int64_t r0, int64_t r1) {
  softmax_rows_any(x, norm, C, r0, r1);
}
template <typename T>
void softmax_grad_rows_base(T* x, const T* norm, const int64_t* targets, T g, int64_t C, int64_t r0, int64_t r1) {
  softmax_grad_rows_any(x, norm, targets, g, C, r0, r1);
}
#if SEQREC_CPU_X86
template <typename T>
SEQREC_CPU_AVX2 void softmax_rows_avx2(T* x, T* norm, int64_t C, int64_t r0, int64_t r1) {
  softmax_rows_any(x, norm, C, r0, r1);
}
template <typename T>
SEQREC_CPU_AVX512 void softmax_rows_avx512(T* x, T* norm, int64_t C, int64_t r0, int64_t r1) {
  softmax_rows_any(x, norm, C, r0, r1);
}
template <typename T>
SEQREC_CPU_AVX2 void softmax_grad_rows_avx2(T* x, const T* norm, const int64_t* targets, T g, int64_t C, int64_t r0,
                                            int64_t r1) {
  softmax_grad_rows_any(x, norm, targets, g, C, r0, r1);
}
template <typename T>
SEQREC_CPU_AVX512 void softmax_grad_rows_avx512(T* x, const T* norm, const int64_t* targets, T g, int64_t C,
                                                int64_t r0, int64_t r1) {
  softmax_grad_rows_any(x, norm, targets, g, C, r0, r1);
}
#endif

template <typename T>
void softmax_rows(T* x, T* norm, int64_t n, int64_t C) {
  at::parallel_for(0, n, grain(C), [&](int64_t r0, int64_t r1) {
#if SEQREC_CPU_X86
    if (cpu_has_avx512()) return softmax_rows_avx512(x, norm, C, r0, r1);
    if (cpu_has_avx2_fma()) return softmax_rows_avx2(x, norm, C, r0, r1);
#endif
    softmax_rows_base(x, norm, C, r0, r1);
  });
}

template <typename T>
void softmax_grad_rows(T* x, const T* norm, const int64_t* targets, T g, int64_t n, int64_t C) {
  at::parallel_for(0, n, grain(C), [&](int64_t r0, int64_t r1) {
#if SEQREC_CPU_X86
    if (cpu_has_avx512()) return softmax_grad_rows_avx512(x, norm, targets, g, C, r0, r1);
    if (cpu_has_avx2_fma()) return softmax_grad_rows_avx2(x, norm, targets, g, C, r0, r1);
#endif
    softmax_grad_rows_base(x, norm, targets, g, C, r0, r1);
  });
}

}  // namespace

bool softmax_rows_fusable(const at::Tensor& logits) {
  return logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous() &&
         (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kDouble);
}

void softmax_rows_fused(const at::Tensor& logits, const at::Tensor& norm) {
  TORCH_CHECK(softmax_rows_fusable(logits) && norm.is_contiguous() && norm.scalar_type() == logits.scalar_type() &&
                  norm.dim() == 2 && norm.size(0) == logits.size(0) && norm.size(1) == 2,
              "softmax_rows_fused: logits must be contiguous float/double [n, C] on the CPU and norm [n, 2] of "
              "its dtype; got ", logits.sizes(), " ", logits.scalar_type(), " and ", norm.sizes());
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "softmax_rows_fused", [&] {
    softmax_rows(logits.data_ptr<scalar_t>(), norm.data_ptr<scalar_t>(), logits.size(0), logits.size(1));
  });
}

void softmax_grad_rows_fused(const at::Tensor& rows, const at::Tensor& norm, const at::Tensor& targets,
                             const at::Tensor& g) {
  TORCH_CHECK(softmax_rows_fusable(rows) && targets.is_contiguous() && targets.scalar_type() == at::kLong &&
                  targets.numel() == rows.size(0) && g.numel() == 1,
              "softmax_grad_rows_fused: rows must be contiguous float/double [n, C] on the CPU, targets int64 [n], "
              "g a scalar; got ", rows.sizes(), " ", rows.scalar_type(), ", ", targets.sizes(), ", ", g.sizes());
  TORCH_CHECK(!norm.defined() || (norm.is_contiguous() && norm.scalar_type() == rows.scalar_type() &&
                                  norm.size(0) == rows.size(0) && norm.size(1) == 2),
              "softmax_grad_rows_fused: norm must be [n, 2] of the rows' dtype; got ", norm.sizes());
  AT_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "softmax_grad_rows_fused", [&] {
    softmax_grad_rows(rows.data_ptr<scalar_t>(), norm.defined() ? norm.data_ptr<scalar_t>() : nullptr,
                      targets.data_ptr<int64_t>(), g.item<scalar_t>(), rows.size(0), rows.size(1));
  });
}

}  // namespace seqrec::ops::detail
