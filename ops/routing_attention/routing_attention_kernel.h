#pragma once
// The body of routed attention's CUDA kernels (routing_attention.cu), written once for nvcc and
// the host compiler (ops/kernel_common.h): the device runs it with one warp per (sequence, head,
// query slot) row, and emulate() runs the same functions on the CPU with an emulated warp
// (RoutingAttention.CudaKernelLogicMatchesCpuKernel). No Torch and no CUDA headers here.
//
// The arithmetic is the fused CPU kernel's (routing_attention_fused.cpp, which derives it): per
// query i with keys j_0..j_{W-1} = window(i) (invalid ones skipped) and j_W = i,
//     l_n = scale·<r_i, r_{j_n}>,  p = softmax(l),  out_i = sum_n p_n·m_n·v_{j_n}
// (m the dropout keep mask, 1 without dropout), and backward, g = dL/dout_i:
//     dl_n = m_n·<g, v_{j_n}>,  dl_n <- scale·p_n·(dl_n - sum_k p_k·dl_k)
//     dr_i += sum_{n<W} dl_n·r_{j_n} + 2·dl_W·r_i,  dr_{j_n} += dl_n·r_i,  dv_{j_n} += p_n·m_n·g.
// Each dot product is a warp sum over the feature lanes (lane k holds features k, k + 32, ...);
// the scores, probabilities and dl_n pass between lanes through the probs and dl rows in
// memory, with a warp sync between writer and readers. A key's row is shared by every query
// whose window holds it, so the gradients of r and v are atomic adds on the device.
#include <cstdint>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda::routing_kernel {

// Contiguous rows of routed_attention (routing_attention.h): rows = B·H·L queries.
template <typename T>
struct Args {
  const T* r;              // [B, H, L, d] queries and keys
  const T* v;              // [B, H, L, dv]
  const int64_t* window;   // [B, H, L, W] key slots
  const bool* valid;       // [B, H, L, W]
  const bool* pad;         // [B, L]
  const T* mask;           // [B, H, L, W + 1] dropout keep factors; nullptr without dropout
  T* out;                  // forward: [B, H, L, dv]
  T* probs;                // forward: [B, H, L, W + 1] softmax(l) (written), backward: read
  const T* grad;           // backward: [B, H, L, dv]
  T* gr;                   // backward: [B, H, L, d], added to
  T* gv;                   // backward: [B, H, L, dv], added to
  T* dl;                   // backward: [B, H, L, W + 1] scratch
  int64_t B, H, L, W, d, dv;
  T scale;

  SEQREC_KERNEL_FN T keep(int64_t row, int64_t n) const { return mask ? mask[row * (W + 1) + n] : T(1); }
};

struct NoState {};

// Forward of query row (b·H + h)·L + i: out and probs.
template <typename T, class Warp>
SEQREC_KERNEL_FN void forward_row(Warp& warp, const Args<T>& a, int64_t row) {
  const int64_t bh = row / a.L, i = row - bh * a.L, W = a.W, d = a.d, dv = a.dv;
  T* o = a.out + row * dv;
  T* p = a.probs + row * (W + 1);
  if (a.pad[(bh / a.H) * a.L + i]) {
    warp.each([&](int lane, NoState&) {
      for (int64_t k = lane; k < dv; k += kWarpSize) o[k] = T(0);
      for (int64_t n = lane; n <= W; n += kWarpSize) p[n] = T(0);
    });
    return;
  }
  const T* rs = a.r + bh * a.L * d;
  const T* vs = a.v + bh * a.L * dv;
  const T* ri = rs + i * d;
  const int64_t* win = a.window + row * W;
  const bool* ok = a.valid + row * W;
  // Scores: invalid keys -inf (probability exactly 0), as in the reference.
  T top = -kinf<T>();
  for (int64_t n = 0; n <= W; ++n) {
    T score = -kinf<T>();
    if (n == W || ok[n]) {
      const T* rj = rs + (n == W ? i : win[n]) * d;
      score = a.scale * warp.sum([&](int lane, NoState&) {
        T acc = T(0);
        for (int64_t k = lane; k < d; k += kWarpSize) acc += ri[k] * rj[k];
        return acc;
      });
    }
    top = kmax(top, score);
    warp.lead([&] { p[n] = score; });
  }
  warp.sync();
  const T z = warp.sum([&](int lane, NoState&) {
    T acc = T(0);
    for (int64_t n = lane; n <= W; n += kWarpSize) acc += kexp(p[n] - top);
    return acc;
  });
  warp.each([&](int lane, NoState&) {  // each lane rewrites only the entries it read
    for (int64_t n = lane; n <= W; n += kWarpSize) p[n] = kexp(p[n] - top) / z;
  });
  warp.sync();
  warp.each([&](int lane, NoState&) {
    for (int64_t k = lane; k < dv; k += kWarpSize) {
      T acc = T(0);
      for (int64_t n = 0; n < W; ++n)
        if (ok[n]) acc += p[n] * a.keep(row, n) * vs[win[n] * dv + k];
      o[k] = acc + p[W] * a.keep(row, W) * vs[i * dv + k];
    }
  });
}

// Backward of query row (b·H + h)·L + i: adds its terms to gr and gv.
template <typename T, class Warp>
SEQREC_KERNEL_FN void backward_row(Warp& warp, const Args<T>& a, int64_t row) {
  const int64_t bh = row / a.L, i = row - bh * a.L, W = a.W, d = a.d, dv = a.dv;
  if (a.pad[(bh / a.H) * a.L + i]) return;  // output 0: no gradient in or out
  const T* rs = a.r + bh * a.L * d;
  const T* vs = a.v + bh * a.L * dv;
  const T* ri = rs + i * d;
  T* grs = a.gr + bh * a.L * d;
  T* gvs = a.gv + bh * a.L * dv;
  const int64_t* win = a.window + row * W;
  const bool* ok = a.valid + row * W;
  const T* p = a.probs + row * (W + 1);
  const T* g = a.grad + row * dv;
  T* dl = a.dl + row * (W + 1);
  T sum = T(0);
  for (int64_t n = 0; n <= W; ++n) {
    T dln = T(0);
    if (n == W || ok[n]) {
      const T* vj = vs + (n == W ? i : win[n]) * dv;
      dln = a.keep(row, n) * warp.sum([&](int lane, NoState&) {
        T acc = T(0);
        for (int64_t k = lane; k < dv; k += kWarpSize) acc += g[k] * vj[k];
        return acc;
      });
    }
    sum += p[n] * dln;
    warp.lead([&] { dl[n] = dln; });
  }
  warp.sync();
  warp.each([&](int lane, NoState&) {
    for (int64_t k = lane; k < d; k += kWarpSize) {
      T own = T(0);
      for (int64_t n = 0; n < W; ++n) {
        if (!ok[n]) continue;
        const T dln = a.scale * p[n] * (dl[n] - sum);
        own += dln * rs[win[n] * d + k];
        atomic_add(grs + win[n] * d + k, dln * ri[k]);
      }
      own += T(2) * (a.scale * p[W] * (dl[W] - sum)) * ri[k];
      atomic_add(grs + i * d + k, own);
    }
    for (int64_t k = lane; k < dv; k += kWarpSize) {
      for (int64_t n = 0; n < W; ++n)
        if (ok[n]) atomic_add(gvs + win[n] * dv + k, p[n] * a.keep(row, n) * g[k]);
      atomic_add(gvs + i * dv + k, p[W] * a.keep(row, W) * g[k]);
    }
  });
}

// The forward (backward = false) or backward kernel on the CPU, row by row (the gradient rows'
// sums are the only thing the rows share, so their order changes nothing but rounding).
template <typename T>
void emulate(const Args<T>& a, bool backward) {
  for (int64_t row = 0; row < a.B * a.H * a.L; ++row) {
    EmulatedWarp<NoState> warp;
    if (backward)
      backward_row<T>(warp, a, row);
    else
      forward_row<T>(warp, a, row);
  }
}

}  // namespace seqrec::ops::cuda::routing_kernel
