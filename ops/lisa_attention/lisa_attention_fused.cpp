// lisa_attention on the CPU: the decayed histogram scan, the per-codebook normalisation and the
// attention weights in one pass per (sequence, codebook), with a hand-written backward; on a
// CUDA device the same algorithm in lisa_attention.cu's kernels, behind the same Function.
//
// The reference (lisa_attention_ref.cpp) builds about ten [B, L, C, W] tensors forward (the
// histogram, the gathered logits, their logs, maxima, exponentials, weights...) and as many
// again in autograd's backward; at LISA-Base's setting (B 128, L 300, C 8, W 128) each is 157 MB.
// Here, per (b, c), a running histogram F[W] walks the slots in order:
//     F     = decay·F + weights[b, i, c, :]        (padded slots add nothing)
//     t     = table[c, psi[b, i, c], :]
//     A[w]  = F[w]·exp(t[w] - s) / z,   z = sum_w F[w]·exp(t[w] - s)
// and only A [B, L, C, W] and r = s + log z [B, L, C] are kept; out = A·values is one GEMM.
// The shift s: max_{present w} t[w] + log max_w F[w] bounds every t[w] + log F[w] from above
// (so no term exceeds 1), one log per row instead of W; when that leaves z below
// kSmallZ (present codewords whose logits and counts disagree by ~70 nats) the row is redone
// with the reference's exact shift max_{present w} (t[w] + log F[w]). Either is capped, as in the
// reference, at max_w t[w] - kMaxShiftGap, so exp(t - s) stays finite for absent codewords.
//
// Backward, from gA = gout·valuesᵀ (one GEMM), per (b, c) from the last slot to the first:
//     d[w]   = gA[w] - sum_w' gA[w']·A[w']
//     gT[c, psi, w] += d[w]·A[w]                   (dA/dt through the softmax)
//     gF[w]  = d[w]·exp(t[w] - r)                  (= d[w]·exp(t[w] - s) / z, nonzero at F = 0:
//                                                   straight-through codes still learn)
//     G      = decay·G + gF,  gweights[b, i, c, :] = G (0 at padded slots)
// written over gA in place; gvalues = Aᵀ·gout. A row with no histogram (or a padded slot) has
// A = 0 and r = +inf, so it passes no gradient, as in the reference.
#include "ops/lisa_attention/lisa_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/kernels.h"
#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include "ops/cuda_launch.h"
#include "ops/lisa_attention/lisa_attention_cuda.h"
#endif

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kMaxShiftGap = 60.0;  // as in the reference

template <typename T>
constexpr T small_z() {
  return std::is_same<T, float>::value ? static_cast<T>(1e-20) : static_cast<T>(1e-200);
}

// exp for float in a form GCC vectorises (range reduction by round-to-nearest through the
// 1.5·2^23 trick, a degree-6 polynomial on [-ln2/2, ln2/2], 2^n by exponent bits): relative
// error below 2e-7 on [-87, 88]; arguments are clamped there (the results enter only through
// products with F or with gradients, where 1e-38 and 0 are the same thing). The loops that use it
// carry `omp simd` (this file is compiled with -fopenmp-simd: vector loops, no OpenMP runtime),
// which lets the reductions (sum, max) vectorise without -ffast-math.
#pragma omp declare simd notinbranch
inline float exp_of(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
#pragma omp declare simd notinbranch
inline double exp_of(double x) { return std::exp(x); }

// Per (b, c) forward: A[b, :, c, :] and r[b, :, c]. Strides are those of contiguous
// [B, L, C, W] (weights, A) and [B, L, C] (index, r).
template <typename T>
void forward_row(const T* __restrict w, const int64_t* __restrict psi, const bool* __restrict pad,
                 const T* __restrict table, T* __restrict A, T* __restrict r, int64_t L, int64_t C, int64_t W,
                 T decay, std::vector<T>& F, std::vector<T>& e) {
  std::fill(F.begin(), F.end(), T(0));
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < L; ++i) {
    const int64_t slot = i * C;  // (i, c) offset in [L, C] units; c already applied by the caller
    T* a = A + slot * W;
    T* f = F.data();
    if (pad[i]) {
      if (decay != T(1))
        for (int64_t k = 0; k < W; ++k) f[k] *= decay;
      std::fill(a, a + W, T(0));
      r[slot] = inf;
      continue;
    }
    const T* x = w + slot * W;
    if (decay != T(1))
      for (int64_t k = 0; k < W; ++k) f[k] = decay * f[k] + x[k];
    else
      for (int64_t k = 0; k < W; ++k) f[k] += x[k];
    const T* t = table + psi[slot] * W;
    T max_f = 0, max_t = -inf, max_tp = -inf;
#pragma omp simd reduction(max : max_f, max_t, max_tp)
    for (int64_t k = 0; k < W; ++k) {
      max_f = std::max(max_f, f[k]);
      max_t = std::max(max_t, t[k]);
      max_tp = std::max(max_tp, f[k] > T(0) ? t[k] : -inf);
    }
    if (!(max_f > T(0))) {  // nothing seen yet in this codebook
      std::fill(a, a + W, T(0));
      r[slot] = inf;
      continue;
    }
    const T cap = max_t - static_cast<T>(kMaxShiftGap);
    T s = std::max(max_tp + std::log(max_f), cap);
    T z = 0;
    T* ev = e.data();
#pragma omp simd reduction(+ : z)
    for (int64_t k = 0; k < W; ++k) {
      ev[k] = f[k] * exp_of(t[k] - s);
      z += ev[k];
    }
    if (z < small_z<T>()) {  // the bound was loose by ~70 nats: the reference's exact shift
      T m = -inf;
      for (int64_t k = 0; k < W; ++k)
        if (f[k] > T(0)) m = std::max(m, t[k] + std::log(f[k]));
      s = std::max(m, cap);
      z = 0;
      for (int64_t k = 0; k < W; ++k) {
        ev[k] = f[k] * exp_of(t[k] - s);
        z += ev[k];
      }
    }
    if (!(z > T(0))) {
      std::fill(a, a + W, T(0));
      r[slot] = inf;
      continue;
    }
    const T inv = T(1) / z;
    for (int64_t k = 0; k < W; ++k) a[k] = ev[k] * inv;
    r[slot] = s + std::log(z);
  }
}

// Per (b, c) backward over gA (in place: gA becomes the weights' gradient), accumulating the
// table's gradient into gT (this task's own [C, W, W] buffer).
template <typename T>
void backward_row(T* __restrict g, const T* __restrict A, const T* __restrict r, const int64_t* __restrict psi,
                  const bool* __restrict pad, const T* __restrict table, T* __restrict gT, int64_t L, int64_t C,
                  int64_t W, T decay, std::vector<T>& G) {
  std::fill(G.begin(), G.end(), T(0));
  T* run = G.data();
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t slot = i * C;
    T* gi = g + slot * W;
    const T* a = A + slot * W;
    const T ri = r[slot];
    if (decay != T(1))
      for (int64_t k = 0; k < W; ++k) run[k] *= decay;
    if (std::isfinite(ri)) {
      const T* t = table + psi[slot] * W;
      T* gt = gT + psi[slot] * W;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t k = 0; k < W; ++k) dot += gi[k] * a[k];
#pragma omp simd
      for (int64_t k = 0; k < W; ++k) {
        const T d = gi[k] - dot;
        gt[k] += d * a[k];
        run[k] += d * exp_of(t[k] - ri);
      }
    }
    if (pad[i])
      std::fill(gi, gi + W, T(0));
    else
      std::copy(run, run + W, gi);
  }
}

// The scan and normalisation on the CPU: A and r from the inputs, one (b, c) row per task.
void cpu_forward(const at::Tensor& weights, const at::Tensor& index, const at::Tensor& pad, const at::Tensor& table,
                 const at::Tensor& A, const at::Tensor& r, double decay) {
  const int64_t B = A.size(0), L = A.size(1), C = A.size(2), W = A.size(3);
  AT_DISPATCH_FLOATING_TYPES(weights.scalar_type(), "lisa_attention_fused", [&] {
    const auto* w = weights.data_ptr<scalar_t>();
    const auto* t = table.data_ptr<scalar_t>();
    const auto* psi = index.data_ptr<int64_t>();
    const auto* p = pad.data_ptr<bool>();
    auto* a = A.data_ptr<scalar_t>();
    auto* rr = r.data_ptr<scalar_t>();
    at::parallel_for(0, B * C, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> F(W), e(W);
      for (int64_t bc = begin; bc < end; ++bc) {
        const int64_t b = bc / C, c = bc % C;
        const int64_t off = b * L * C + c;  // slot (b, 0, c) in [B, L, C] units
        forward_row<scalar_t>(w + off * W, psi + off, p + b * L, t + c * W * W, a + off * W, rr + off, L, C, W,
                              static_cast<scalar_t>(decay), F, e);
      }
    });
  });
}

// Their backward on the CPU: g (gA) becomes the weights' gradient in place; returns the table's.
at::Tensor cpu_backward(const at::Tensor& g, const at::Tensor& A, const at::Tensor& r, const at::Tensor& index,
                        const at::Tensor& pad, const at::Tensor& table, double decay) {
  const int64_t B = A.size(0), L = A.size(1), C = A.size(2), W = A.size(3);
  const int64_t tasks = B * C;
  const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), tasks));
  auto partial = torch::zeros({slots, C, W, W}, A.options());
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "lisa_attention_fused_backward", [&] {
    auto* gp = g.data_ptr<scalar_t>();
    const auto* a = A.data_ptr<scalar_t>();
    const auto* rr = r.data_ptr<scalar_t>();
    const auto* t = table.data_ptr<scalar_t>();
    const auto* psi = index.data_ptr<int64_t>();
    const auto* p = pad.data_ptr<bool>();
    auto* gT = partial.data_ptr<scalar_t>();
    // One contiguous range of (b, c) tasks per buffer: a buffer is never shared.
    const int64_t per = (tasks + slots - 1) / slots;
    at::parallel_for(0, slots, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> G(W);
      for (int64_t s = begin; s < end; ++s)
        for (int64_t bc = s * per; bc < std::min(tasks, (s + 1) * per); ++bc) {
          const int64_t b = bc / C, c = bc % C;
          const int64_t off = b * L * C + c;
          backward_row<scalar_t>(gp + off * W, a + off * W, rr + off, psi + off, p + b * L, t + c * W * W,
                                 gT + (s * C + c) * W * W, L, C, W, static_cast<scalar_t>(decay), G);
        }
    });
  });
  return partial.sum(0);
}

#if SEQREC_HAVE_CUDA
// The same two on a CUDA device: lisa_attention.cu's kernels, one warp per (b, c) row and
// segment, the table's gradient by atomic adds into one buffer. `sums` becomes the segments'
// workspace (undefined with one segment) and must outlive the launch.
template <typename T>
cuda::lisa_kernel::Args<T> kernel_args(const at::Tensor& index, const at::Tensor& pad, const at::Tensor& table,
                                       const at::Tensor& A, const at::Tensor& r, double decay, at::Tensor& sums) {
  cuda::lisa_kernel::Args<T> a{};
  a.psi = index.data_ptr<int64_t>();
  a.pad = pad.data_ptr<bool>();
  a.table = table.data_ptr<T>();
  a.A = A.data_ptr<T>();
  a.r = r.data_ptr<T>();
  a.B = A.size(0);
  a.L = A.size(1);
  a.C = A.size(2);
  a.W = A.size(3);
  a.decay = static_cast<T>(decay);
  a.seg_len = cuda::lisa_attention_segment_len(a.B * a.C, a.L);
  const int64_t scratch = cuda::lisa_kernel::workspace_elements(a.B * a.C, a.L, a.W, a.seg_len);
  if (scratch > 0) {
    sums = torch::empty({scratch}, A.options());
    a.sums = sums.data_ptr<T>();
  }
  return a;
}

void cuda_forward(const at::Tensor& weights, const at::Tensor& index, const at::Tensor& pad, const at::Tensor& table,
                  const at::Tensor& A, const at::Tensor& r, double decay) {
  const CudaLaunch launch(A);
  at::Tensor sums;
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "lisa_attention_cuda", [&] {
    auto a = kernel_args<scalar_t>(index, pad, table, A, r, decay, sums);
    a.weights = weights.data_ptr<scalar_t>();
    cuda::lisa_attention_forward_launch<scalar_t>(a, launch.stream());
  });
}

at::Tensor cuda_backward(const at::Tensor& g, const at::Tensor& A, const at::Tensor& r, const at::Tensor& index,
                         const at::Tensor& pad, const at::Tensor& table, double decay) {
  auto gtable = torch::zeros(table.sizes(), A.options());
  const CudaLaunch launch(A);
  at::Tensor sums;
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "lisa_attention_cuda_backward", [&] {
    auto a = kernel_args<scalar_t>(index, pad, table, A, r, decay, sums);
    a.g = g.data_ptr<scalar_t>();
    a.gtable = gtable.data_ptr<scalar_t>();
    cuda::lisa_attention_backward_launch<scalar_t>(a, launch.stream());
  });
  return gtable;
}
#endif

// One autograd Function for both devices: the scan's passes run on the inputs' device (the CPU
// loops above, or the CUDA kernels), the products by the values are GEMMs.
struct LisaAttentionFused : public torch::autograd::Function<LisaAttentionFused> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weights_in, const at::Tensor& table_in,
                               const at::Tensor& values_in, const at::Tensor& index_in, const at::Tensor& pad_in,
                               double decay) {
    auto weights = weights_in.contiguous(), table = table_in.contiguous(), values = values_in.contiguous();
    auto index = index_in.contiguous(), pad = pad_in.contiguous();
    const int64_t B = weights.size(0), L = weights.size(1), C = weights.size(2), W = weights.size(3),
                  D = values.size(2);
    auto A = torch::empty({B, L, C, W}, weights.options());
    auto r = torch::empty({B, L, C}, weights.options());
#if SEQREC_HAVE_CUDA
    if (weights.is_cuda())
      cuda_forward(weights, index, pad, table, A, r, decay);
    else
#endif
      cpu_forward(weights, index, pad, table, A, r, decay);
    auto out = A.view({B * L, C * W}).mm(values.view({C * W, D})).view({B, L, D});
    ctx->save_for_backward({A, r, index, pad, table, values});
    ctx->saved_data["decay"] = decay;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &A = saved[0], &r = saved[1], &index = saved[2], &pad = saved[3], &table = saved[4],
               &values = saved[5];
    const double decay = ctx->saved_data["decay"].toDouble();
    const int64_t B = A.size(0), L = A.size(1), C = A.size(2), W = A.size(3), D = values.size(2);
    auto gout = grads[0].contiguous().view({B * L, D});
    auto gvalues = A.view({B * L, C * W}).t().mm(gout).view({C, W, D});
    auto g = gout.mm(values.view({C * W, D}).t()).view({B, L, C, W});  // gA, then gweights in place
    at::Tensor gtable;
#if SEQREC_HAVE_CUDA
    if (A.is_cuda())
      gtable = cuda_backward(g, A, r, index, pad, table, decay);
    else
#endif
      gtable = cpu_backward(g, A, r, index, pad, table, decay);
    return {g, gtable, gvalues, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor lisa_attention(const at::Tensor& weights, const at::Tensor& query_index, const at::Tensor& key_padding,
                          const at::Tensor& table, const at::Tensor& values, double decay) {
  check_lisa_attention_args(weights, query_index, key_padding, table, values, decay);
  const bool floating = weights.scalar_type() == at::kFloat || weights.scalar_type() == at::kDouble;
  bool fused = fused_kernels() && floating && weights.device().is_cpu();
#if SEQREC_HAVE_CUDA
  fused = fused || (fused_kernels() && floating && weights.is_cuda() && weights.size(3) <= cuda::kLisaMaxCodewords);
#endif
  if (!fused) return lisa_attention_reference(weights, query_index, key_padding, table, values, decay);
  const int64_t B = weights.size(0), L = weights.size(1), D = values.size(2);
  if (B == 0 || L == 0) return torch::zeros({B, L, D}, values.options());
  return LisaAttentionFused::apply(weights, table, values, query_index, key_padding, decay)[0];
}

}  // namespace seqrec::ops
