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
// Segments let short grids (few rows, long sequences) fill the device, as in the linear kernel:
// a row's slots are cut into segments of seg_len, one warp each. Both walks are linear in their
// running state (F_i = γ·F_{i-1} + x_i forward, G_i = γ·G_{i+1} + u_i backward, where u_i
// depends on slot i alone), so a first launch (sums only) writes each segment's own walk from
// zero to a workspace, and each warp of the second starts from the sums of the segments before
// its own in walk order, folded as F <- γ^seg_len·F + sum. With one segment the second launch
// alone runs, from zero.
//
// Rounding differs from the CPU kernel's only in the order of the sums over W (lanes, then the
// butterfly), in exp (the CPU kernel's float exp is a polynomial) and, with segments, in where
// the running state is summed; branches are taken on warp-wide values, so a warp never diverges
// around a shuffle. Segment bounds depend on the shapes alone, so a later slot cannot change an
// earlier output even by rounding.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda::lisa_kernel {

constexpr int kMaxPer = 16;  // codewords per lane at most
constexpr int64_t kMaxCodewords = static_cast<int64_t>(kWarpSize) * kMaxPer;
constexpr double kMaxShiftGap = 60.0;  // as in the reference and the CPU kernel

// Segments: at least kMinSegment slots each, at most kMaxSegments per row, and only while the
// grid is short of kWarpsPerSm warps per multiprocessor.
constexpr int64_t kMinSegment = 64;
constexpr int64_t kMaxSegments = 64;
constexpr int64_t kWarpsPerSm = 16;

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
  int64_t seg_len = 0;  // slots per segment; <= 0 or >= L: one segment
  T* sums = nullptr;    // [B·C, segments, W]: each segment's own walk from zero (unused with one)
  T decay_seg = T(1);   // decay^seg_len, set by prepare()
};

// The args as the launches take them: decay_seg filled in (on the host).
template <typename T>
Args<T> prepare(Args<T> a) {
  a.decay_seg = segments(a.L, a.seg_len) > 1 ? static_cast<T>(std::pow(static_cast<double>(a.decay),
                                                                       static_cast<double>(a.seg_len)))
                                             : T(1);
  return a;
}

// Warps per launch: every (row, segment) for the outputs; for the sums-only launch every
// segment but the last in walk order (the first in the backward's).
template <typename T>
SEQREC_KERNEL_FN int64_t launch_warps(const Args<T>& a, bool sums_only) {
  const int64_t segs = segments(a.L, a.seg_len);
  return a.B * a.C * (sums_only ? segs - 1 : segs);
}

// Warp w's (row, segment) in a launch.
template <typename T>
SEQREC_KERNEL_FN void warp_task(const Args<T>& a, int64_t w, bool sums_only, bool backward, int64_t& row,
                                int64_t& g) {
  const int64_t per_row = segments(a.L, a.seg_len) - (sums_only ? 1 : 0);
  row = w / per_row;
  g = w - row * per_row + (sums_only && backward ? 1 : 0);
}

// Slots per segment for `rows` rows of L slots on a device of sms multiprocessors: L (one
// segment) when the grid already has kWarpsPerSm warps per multiprocessor or L is short; else
// the fewest segments that reach it, each at least kMinSegment slots, at most kMaxSegments.
inline int64_t plan_segment_len(int64_t rows, int64_t L, int64_t sms) {
  return cuda::plan_segment_len(rows, kWarpsPerSm * (sms > 0 ? sms : 1), L, kMinSegment, kMaxSegments, 1);
}

// Workspace elements of one launch pair (0 with one segment).
inline int64_t workspace_elements(int64_t rows, int64_t L, int64_t W, int64_t seg_len) {
  const int64_t segs = segments(L, seg_len);
  return segs > 1 ? rows * segs * W : 0;
}

// Row `row`'s running state at the start of segment g's walk: the sums of the segments walked
// before it (forward: 0 .. g-1; backward: the last down to g+1), each folded in as
// F <- decay^seg_len·F + sum. Only a segment's own sum can be short, never a folded-over one.
template <typename T, int kPer, class Warp, class S>
SEQREC_KERNEL_FN void init_state(Warp& warp, const Args<T>& a, int64_t row, int64_t g, bool backward) {
  const int64_t segs = segments(a.L, a.seg_len), W = a.W;
  warp.each([&](int, S& s) {
    SEQREC_KERNEL_UNROLL
    for (int j = 0; j < kPer; ++j) s.F[j] = T(0);
  });
  const int64_t first = backward ? segs - 1 : 0, step = backward ? -1 : 1;
  for (int64_t h = first; h != g; h += step) {
    const T* sum = a.sums + (row * segs + h) * W;
    warp.each([&](int lane, S& s) {
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int64_t w = lane + j * kWarpSize;
        if (w < W) s.F[j] = (a.decay != T(1) ? a.decay_seg * s.F[j] : s.F[j]) + sum[w];
      }
    });
  }
}

template <typename T, int kPer, class Warp, class S>
SEQREC_KERNEL_FN void store_sums(Warp& warp, const Args<T>& a, int64_t row, int64_t g) {
  T* sum = a.sums + (row * segments(a.L, a.seg_len) + g) * a.W;
  warp.each([&](int lane, S& s) {
    SEQREC_KERNEL_UNROLL
    for (int j = 0; j < kPer; ++j) {
      const int64_t w = lane + j * kWarpSize;
      if (w < a.W) sum[w] = s.F[j];
    }
  });
}

// One lane's registers: its codewords' running histogram (or gradient), logits and terms.
template <typename T, int kPer>
struct Lane {
  T F[kPer], t[kPer], e[kPer];
  T max_f, max_t, max_tp;
};

// Forward of row (b, c) over segment g: A and r at its slots; kSumsOnly: the segment's own
// histogram alone, to the workspace.
template <typename T, int kPer, bool kSumsOnly, class Warp>
SEQREC_KERNEL_FN void forward_row(Warp& warp, const Args<T>& a, int64_t row, int64_t g) {
  using L_ = Lane<T, kPer>;
  const int64_t b = row / a.C, c = row - b * a.C, W = a.W;
  const T inf = kinf<T>(), decay = a.decay;
  int64_t begin = 0, end = 0;
  segment_bounds(a.L, a.seg_len, g, begin, end);
  if (kSumsOnly) {
    warp.each([&](int, L_& s) {
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) s.F[j] = T(0);
    });
  } else {
    init_state<T, kPer, Warp, L_>(warp, a, row, g, false);
  }
  for (int64_t i = begin; i < end; ++i) {
    const int64_t slot = (b * a.L + i) * a.C + c;
    if (kSumsOnly) {
      const T* x = a.weights + slot * W;
      const bool padded = a.pad[b * a.L + i];  // adds nothing; the histogram still decays
      warp.each([&](int lane, L_& s) {
        SEQREC_KERNEL_UNROLL
        for (int j = 0; j < kPer; ++j) {
          const int64_t w = lane + j * kWarpSize;
          if (w < W) {
            const T f = decay != T(1) ? decay * s.F[j] : s.F[j];
            s.F[j] = padded ? f : f + x[w];
          }
        }
      });
      continue;
    }
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
  if (kSumsOnly) store_sums<T, kPer, Warp, L_>(warp, a, row, g);
}

// Backward of row (b, c) over segment g, from its last slot to its first: g (gA in place)
// becomes the weights' gradient, and the table's gradient is added to gtable; kSumsOnly: the
// segment's own running gradient alone, to the workspace (g and gtable untouched).
template <typename T, int kPer, bool kSumsOnly, class Warp>
SEQREC_KERNEL_FN void backward_row(Warp& warp, const Args<T>& a, int64_t row, int64_t seg) {
  using L_ = Lane<T, kPer>;
  const int64_t b = row / a.C, c = row - b * a.C, W = a.W;
  const T inf = kinf<T>(), decay = a.decay;
  int64_t begin = 0, end = 0;
  segment_bounds(a.L, a.seg_len, seg, begin, end);
  if (kSumsOnly) {  // F holds the running gradient G
    warp.each([&](int, L_& s) {
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) s.F[j] = T(0);
    });
  } else {
    init_state<T, kPer, Warp, L_>(warp, a, row, seg, true);
  }
  for (int64_t i = end - 1; i >= begin; --i) {
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
            if (!kSumsOnly) atomic_add(gt + w, d * A[w]);
            s.F[j] += d * kexp(t[w] - r);
          }
        }
      });
    }
    if (kSumsOnly) continue;
    const bool padded = a.pad[b * a.L + i];
    warp.each([&](int lane, L_& s) {
      SEQREC_KERNEL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int64_t w = lane + j * kWarpSize;
        if (w < W) g[w] = padded ? T(0) : s.F[j];
      }
    });
  }
  if (kSumsOnly) store_sums<T, kPer, Warp, L_>(warp, a, row, seg);
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

// One warp's task in a launch (the kernels' body, for the device and the emulation).
template <typename T, int kPer, bool kBackward, bool kSumsOnly, class Warp>
SEQREC_KERNEL_FN void run_warp(Warp& warp, const Args<T>& a, int64_t w) {
  int64_t row = 0, g = 0;
  warp_task(a, w, kSumsOnly, kBackward, row, g);
  if (kBackward)
    backward_row<T, kPer, kSumsOnly>(warp, a, row, g);
  else
    forward_row<T, kPer, kSumsOnly>(warp, a, row, g);
}

// The forward (backward = false) or backward launches on the CPU, warp by warp: the sums-only
// launch when there are segments, then the outputs' (warps of one launch touch different A, r,
// g and workspace elements, and the table's gradient is a sum, so their order only changes its
// rounding). a.sums must hold workspace_elements() when a.seg_len makes segments.
template <typename T>
void emulate(const Args<T>& args, bool backward) {
  const Args<T> a = prepare(args);
  with_per_lane(a.W, [&](auto per) {
    constexpr int P = decltype(per)::value;
    auto launch = [&](auto sums_only) {
      constexpr bool kSums = decltype(sums_only)::value;
      for (int64_t w = 0; w < launch_warps(a, kSums); ++w) {
        EmulatedWarp<Lane<T, P>> warp;
        if (backward)
          run_warp<T, P, true, kSums>(warp, a, w);
        else
          run_warp<T, P, false, kSums>(warp, a, w);
      }
    };
    if (segments(a.L, a.seg_len) > 1) launch(std::true_type{});
    launch(std::false_type{});
  });
}

}  // namespace seqrec::ops::cuda::lisa_kernel
