#pragma once
// The body of LISA's histogram-attention CUDA kernels (lisa_attention.cu), written once for nvcc
// and the host compiler (ops/kernel_common.h): the device runs it with one warp per (sequence,
// codebook) row, and emulate() runs the same functions on the CPU with an emulated warp
// (LisaAttention.CudaKernelLogicMatchesCpuKernel). No Torch and no CUDA headers here.
//
// The algorithm is the fused CPU kernel's (lisa_attention_fused.cpp, which explains it): per
// row, a running decayed histogram F[W] walks the slots in order, and each slot's attention
// weights A[W] over the codewords and r = s + log z are written; the backward walks the slots
// from the last to the first with the running gradient G[W]. On the device lane l of the row's
// warp holds codewords l, l + 32, l + 64, ... (kPer of them, a compile-time bound: W <= 32·kPer),
// so F, G and the gathered logits stay in registers, every load and store of a slot's row is
// one coalesced 32-lane access, and the row's maxima and sums are warp shuffles. The table's
// gradient gT[c, psi, w] is shared by every sequence's row of codebook c: atomic adds.
//
// Rounding differs from the CPU kernel's only in the order of the sums over W (lanes, then the
// butterfly) and in exp (the CPU kernel's float exp is a polynomial); branches are taken on
// warp-wide values, so a warp never diverges around a shuffle.
#include <cstdint>
#include <type_traits>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda::lisa_kernel {

constexpr int kMaxPer = 16;  // codewords per lane at most
constexpr int64_t kMaxCodewords = static_cast<int64_t>(kWarpSize) * kMaxPer;
constexpr double kMaxShiftGap = 60.0;  // as in the reference and the CPU kernel

template <typename T>
SEQREC_KERNEL_FN T small_z();
template <>
SEQREC_KERNEL_FN float small_z<float>() {
  return 1e-20f;
}
template <>
SEQREC_KERNEL_FN double small_z<double>() {
  return 1e-200;
}

// Contiguous tensors of lisa_attention (lisa_attention.h), B·C rows of L slots.
template <typename T>
struct Args {
  const T* weights;     // [B, L, C, W]
  const int64_t* psi;   // [B, L, C] query codewords
  const bool* pad;      // [B, L]
  const T* table;       // [C, W, W]
  T* A;                 // [B, L, C, W] attention weights (written forward, read backward)
  T* r;                 // [B, L, C] s + log z; +inf where a slot attends to nothing
  T* g;                 // backward: [B, L, C, W], gA in, the weights' gradient out
  T* gtable;            // backward: [C, W, W], added to
  int64_t B, L, C, W;
  T decay;
};

// One lane's registers: its codewords' running histogram (or gradient), logits and terms.
template <typename T, int kPer>
struct Lane {
  T F[kPer], t[kPer], e[kPer];
  T max_f, max_t, max_tp;
};

// Forward of row (b, c): A and r at every slot.
template <typename T, int kPer, class Warp>
SEQREC_KERNEL_FN void forward_row(Warp& warp, const Args<T>& a, int64_t row) {
  using L_ = Lane<T, kPer>;
  const int64_t b = row / a.C, c = row - b * a.C, W = a.W;
  const T inf = kinf<T>(), decay = a.decay;
  warp.each([&](int, L_& s) {
    SEQREC_KERNEL_UNROLL
    for (int j = 0; j < kPer; ++j) s.F[j] = T(0);
  });
  for (int64_t i = 0; i < a.L; ++i) {
    const int64_t slot = (b * a.L + i) * a.C + c;
    T* A = a.A + slot * W;
    auto empty = [&] {
      warp.each([&](int lane, L_&) {
        SEQREC_KERNEL_UNROLL
        for (int j = 0; j < kPer; ++j) {
          const int64_t w = lane + j * kWarpSize;
          if (w < W) A[w] = T(0);
        }
      });
      warp.lead([&] { a.r[slot] = inf; });
    };
    if (a.pad[b * a.L + i]) {  // adds nothing; the histogram still decays
      if (decay != T(1))
        warp.each([&](int, L_& s) {
          SEQREC_KERNEL_UNROLL
          for (int j = 0; j < kPer; ++j) s.F[j] *= decay;
        });
      empty();
      continue;
    }
    const T* x = a.weights + slot * W;
    const T* t = a.table + (c * W + a.psi[slot]) * W;
    warp.each([&](int lane, L_& s) {
      s.max_f = T(0);
      s.max_t = -inf;
      s.max_tp = -inf;
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int64_t w = lane + j * kWarpSize;
        if (w < W) {
          s.F[j] = decay != T(1) ? decay * s.F[j] + x[w] : s.F[j] + x[w];
          s.t[j] = t[w];
          s.max_f = kmax(s.max_f, s.F[j]);
          s.max_t = kmax(s.max_t, s.t[j]);
          if (s.F[j] > T(0)) s.max_tp = kmax(s.max_tp, s.t[j]);
        }
      }
    });
    const T max_f = warp.max([](int, L_& s) { return s.max_f; });
    if (!(max_f > T(0))) {  // nothing seen yet in this codebook
      empty();
      continue;
    }
    const T max_t = warp.max([](int, L_& s) { return s.max_t; });
    const T max_tp = warp.max([](int, L_& s) { return s.max_tp; });
    const T cap = max_t - static_cast<T>(kMaxShiftGap);
    T shift = kmax(max_tp + klog(max_f), cap);
    auto terms = [&](int lane, L_& s) {
      T z = T(0);
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int64_t w = lane + j * kWarpSize;
        s.e[j] = w < W ? s.F[j] * kexp(s.t[j] - shift) : T(0);
        z += s.e[j];
      }
      return z;
    };
    T z = warp.sum(terms);
    if (z < small_z<T>()) {  // the one-log bound was loose by ~70 nats: the exact shift
      const T m = warp.max([&](int lane, L_& s) {
        T v = -inf;
        SEQREC_KERNEL_UNROLL
        for (int j = 0; j < kPer; ++j)
          if (lane + j * kWarpSize < W && s.F[j] > T(0)) v = kmax(v, s.t[j] + klog(s.F[j]));
        return v;
      });
      shift = kmax(m, cap);
      z = warp.sum(terms);
    }
    if (!(z > T(0))) {
      empty();
      continue;
    }
    const T inv = T(1) / z;
    warp.each([&](int lane, L_& s) {
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int64_t w = lane + j * kWarpSize;
        if (w < W) A[w] = s.e[j] * inv;
      }
    });
    warp.lead([&] { a.r[slot] = shift + klog(z); });
  }
}

// Backward of row (b, c), from the last slot to the first: g (gA in place) becomes the
// weights' gradient, and the table's gradient is added to gtable.
template <typename T, int kPer, class Warp>
SEQREC_KERNEL_FN void backward_row(Warp& warp, const Args<T>& a, int64_t row) {
  using L_ = Lane<T, kPer>;
  const int64_t b = row / a.C, c = row - b * a.C, W = a.W;
  const T inf = kinf<T>(), decay = a.decay;
  warp.each([&](int, L_& s) {  // F holds the running gradient G
    SEQREC_KERNEL_UNROLL
    for (int j = 0; j < kPer; ++j) s.F[j] = T(0);
  });
  for (int64_t i = a.L - 1; i >= 0; --i) {
    const int64_t slot = (b * a.L + i) * a.C + c;
    T* g = a.g + slot * W;
    const T* A = a.A + slot * W;
    const T r = a.r[slot];
    if (decay != T(1))
      warp.each([&](int, L_& s) {
        SEQREC_KERNEL_UNROLL
        for (int j = 0; j < kPer; ++j) s.F[j] *= decay;
      });
    if (r < inf) {
      const T* t = a.table + (c * W + a.psi[slot]) * W;
      T* gt = a.gtable + (c * W + a.psi[slot]) * W;
      const T dot = warp.sum([&](int lane, L_&) {
        T v = T(0);
        SEQREC_KERNEL_UNROLL
        for (int j = 0; j < kPer; ++j) {
          const int64_t w = lane + j * kWarpSize;
          if (w < W) v += g[w] * A[w];
        }
        return v;
      });
      warp.each([&](int lane, L_& s) {
        SEQREC_KERNEL_UNROLL
        for (int j = 0; j < kPer; ++j) {
          const int64_t w = lane + j * kWarpSize;
          if (w < W) {
            const T d = g[w] - dot;
            atomic_add(gt + w, d * A[w]);
            s.F[j] += d * kexp(t[w] - r);
          }
        }
      });
    }
    const bool padded = a.pad[b * a.L + i];
    warp.each([&](int lane, L_& s) {
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int64_t w = lane + j * kWarpSize;
        if (w < W) g[w] = padded ? T(0) : s.F[j];
      }
    });
  }
}

// Calls f(std::integral_constant<int, P>{}) with the codewords per lane for W codewords: the
// smallest power of two P with 32·P >= W (1 <= W <= kMaxCodewords).
template <typename F>
void with_per_lane(int64_t W, F&& f) {
  if (W <= 1 * kWarpSize) return f(std::integral_constant<int, 1>{});
  if (W <= 2 * kWarpSize) return f(std::integral_constant<int, 2>{});
  if (W <= 4 * kWarpSize) return f(std::integral_constant<int, 4>{});
  if (W <= 8 * kWarpSize) return f(std::integral_constant<int, 8>{});
  f(std::integral_constant<int, kMaxPer>{});
}

// The forward (backward = false) or backward kernel on the CPU, row by row (rows of different
// warps touch different A, r and g elements, and the table's gradient is a sum, so the rows'
// order only changes its rounding).
template <typename T>
void emulate(const Args<T>& a, bool backward) {
  with_per_lane(a.W, [&](auto per) {
    constexpr int P = decltype(per)::value;
    for (int64_t row = 0; row < a.B * a.C; ++row) {
      EmulatedWarp<Lane<T, P>> warp;
      if (backward)
        backward_row<T, P>(warp, a, row);
      else
        forward_row<T, P>(warp, a, row);
    }
  });
}

}  // namespace seqrec::ops::cuda::lisa_kernel
