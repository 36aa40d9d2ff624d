#pragma once
// The body of LightSANs' causal interest attention on a CUDA device (interest_attention.cu),
// written once for nvcc and the host compiler (ops/kernel_common.h): the device runs it with one
// warp per (sequence, head), and emulate() runs the same functions on the CPU with an emulated
// warp (CausalInterestAttention.CudaKernelLogicMatchesCpuKernel). No Torch and no CUDA headers.
//
// The arithmetic is causal_interest_attention's (interest_attention.h), walked slot by slot
// instead of in chunks. Per sequence b, head h (dims of that head only) and interest j of either
// side (keys: j < k, logits a[:, j]; values: k <= j < 2k), the state after slot t is
//     m_t  = max(m_{t-1}, a[t, j]) if t is real, else m_{t-1}       (running maximum, -inf at first)
//     Z_t  = Z_{t-1} e_t + w_t,   N_t = N_{t-1} e_t + w_t x_t,   e_t = exp(m_{t-1} - m_t),
//     w_t  = exp(a[t, j] - m_t) at a real slot, 0 at a padded one,
// so agg_t[j] = N_t[j] / Z_t[j] (0 where no real slot was seen: Z is clamped to kTiny, N is 0):
//     s_tj = q_t · aggk_t[j] / sqrt(Dh),   p_t = softmax_j(s_t),   out_t = sum_j p_tj m_tj aggv_t[j]
// (m the dropout keep factors, 1 without dropout).
//
// Backward, g_t = dL/dout_t: dp'_j = g_t · aggv_t[j], ds_j = p_j (m_j dp'_j - sum_i p_i m_i dp'_i),
//     dq_t = sum_j ds_j aggk_t[j] / sqrt(Dh),
// and each side's aggregation gets G_t[j] = ds_j q_t / sqrt(Dh) (keys) or p_j m_j g_t (values).
// With U_t = G_t / Z_t + exp(m_t - m_{t+1}) U_{t+1} and c_t = G_t · agg_t / Z_t + exp(m_t - m_{t+1})
// c_{t+1} (reverse scans; the factors are <= 1 since m only grows), a real slot s gets
//     dx_s += exp(a[s, j] - m_s) U_s,   da[s, j] += exp(a[s, j] - m_s) (x_s · U_s - c_s).
// The logits are shared by the heads: each warp writes its head's share of da, summed by the
// host. The forward keeps every slot's m, Z and scores and the state N entering every chunk of
// C slots; the backward walks the chunks in reverse, recomputes each chunk's agg from its saved
// state, then walks its slots in reverse: memory O(L·k + (L / C + C)·k·D) per sequence.
//
// Scalars every lane needs (m, Z, the scores, dp') are computed alike by every lane or written
// by lane 0 to rows in memory and read after a warp sync; each lane owns the dims d = lane,
// lane + 32, ... of the head in the state, the carries and the gradients of k, v and q.
#include <cstdint>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda::interest_kernel {

// Contiguous tensors of causal_interest_attention (interest_attention.h); D = H·Dh, BH = B·H
// warp rows (row = b·H + h), K the interests per side.
template <typename T>
struct Args {
  const T* q;       // [B, H, L, Dh]
  const T* k;       // [B, L, D]
  const T* v;       // [B, L, D]
  const T* a;       // [B, L, 2K]: the key logits, then the value logits
  const bool* pad;  // [B, L]
  const T* mask;    // [B, H, L, K] dropout keep factors; nullptr without dropout
  T* out;           // forward: [B, H, L, Dh]
  T* m;             // [BH, L, 2K] running maxima (forward writes, backward reads)
  T* z;             // [BH, L, 2K] normalisers relative to m (likewise)
  T* s;             // [BH, L, K] scores (likewise)
  T* ckpt;          // [BH, ceil(L / C), 2K, Dh] state entering each chunk; the forward skips it if null
  T* state;         // [BH, 2K, Dh] scratch: the running N
  const T* grad;    // backward: [B, H, L, Dh]
  T* gq;            // backward: [B, H, L, Dh], written
  T* gk;            // backward: [B, L, D], written (each head its own dims)
  T* gv;            // backward: [B, L, D], written
  T* ga;            // backward: [BH, L, 2K], written: this head's share of the logits' gradient
  T* agg;           // backward scratch: [BH, C, 2K, Dh]
  T* carry;         // backward scratch: [BH, 2K, Dh] (U)
  T* carry_c;       // backward scratch: [BH, 2, 2K] (c, by the slot's parity)
  T* dp;            // backward scratch: [BH, K]
  int64_t B, H, L, Dh, K, C;
  T scale;          // 1 / sqrt(Dh)

  SEQREC_KERNEL_FN T keep(int64_t bh, int64_t t, int64_t j) const { return mask ? mask[(bh * L + t) * K + j] : T(1); }
};

struct NoState {};

template <typename T>
SEQREC_KERNEL_FN T tiny() {
  return static_cast<T>(1e-30);  // the CPU kernel's clamp of Z
}

// dst = src (zeros where src is null) over rows [rows, Dh], each lane the dims it owns, so that
// no sync is needed before the lanes use them.
template <typename T, class Warp>
SEQREC_KERNEL_FN void copy_owned(Warp& warp, T* dst, const T* src, int64_t rows, int64_t Dh) {
  warp.each([&](int lane, NoState&) {
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) dst[j * Dh + d] = src ? src[j * Dh + d] : T(0);
  });
}

// Slot t's step of every interest of both sides: state N_{t-1} -> N_t. With `record` (the
// forward) m_t and Z_t are computed and written; without (the backward's recompute) they are read.
template <typename T, class Warp>
SEQREC_KERNEL_FN void advance(Warp& warp, const Args<T>& a, int64_t bh, int64_t t, bool record) {
  const int64_t b = bh / a.H, h = bh - b * a.H, K2 = 2 * a.K, D = a.H * a.Dh, Dh = a.Dh;
  const bool real = !a.pad[b * a.L + t];
  const T* at = a.a + (b * a.L + t) * K2;
  const T* mp = a.m + (bh * a.L + t - 1) * K2;  // read only when t > 0
  const T* zp = a.z + (bh * a.L + t - 1) * K2;
  T* mt = a.m + (bh * a.L + t) * K2;
  T* zt = a.z + (bh * a.L + t) * K2;
  for (int64_t j = 0; j < K2; ++j) {
    const T m_prev = t > 0 ? mp[j] : -kinf<T>();
    const T m_new = record ? (real ? kmax(m_prev, at[j]) : m_prev) : mt[j];
    T e = T(1), w = T(0), z_new = T(0);
    if (m_new != -kinf<T>()) {
      e = m_prev == -kinf<T>() ? T(0) : kexp(m_prev - m_new);
      w = real ? kexp(at[j] - m_new) : T(0);
      z_new = (t > 0 ? zp[j] : T(0)) * e + w;
    }
    const T* x = (j < a.K ? a.k : a.v) + (b * a.L + t) * D + h * Dh;
    T* n = a.state + (bh * K2 + j) * Dh;
    warp.each([&](int lane, NoState&) {
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) n[d] = n[d] * e + w * x[d];
    });
    if (record) warp.lead([&] {
        mt[j] = m_new;
        zt[j] = z_new;
      });
  }
}

// The softmax of slot t's scores, as every lane computes it: p_j = exp(s_j - top) / den.
template <typename T>
struct Softmax {
  const T* s;
  T top, den;
  SEQREC_KERNEL_FN T p(int64_t j) const { return kexp(s[j] - top) / den; }
};

template <typename T>
SEQREC_KERNEL_FN Softmax<T> softmax_of(const T* s, int64_t K) {
  Softmax<T> sm{s, -kinf<T>(), T(0)};
  for (int64_t j = 0; j < K; ++j) sm.top = kmax(sm.top, s[j]);
  for (int64_t j = 0; j < K; ++j) sm.den += kexp(s[j] - sm.top);
  return sm;
}

// Forward of warp row bh = b·H + h: every slot's output, m, Z and scores, and the checkpoints.
template <typename T, class Warp>
SEQREC_KERNEL_FN void forward_row(Warp& warp, const Args<T>& a, int64_t bh) {
  const int64_t K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L;
  const int64_t chunks = (L + a.C - 1) / a.C;
  T* state = a.state + bh * K2 * Dh;
  copy_owned<T>(warp, state, nullptr, K2, Dh);
  for (int64_t t = 0; t < L; ++t) {
    if (a.ckpt && t % a.C == 0) {
      copy_owned<T>(warp, a.ckpt + (bh * chunks + t / a.C) * K2 * Dh, state, K2, Dh);
    }
    advance<T>(warp, a, bh, t, /*record=*/true);
    warp.sync();  // m_t, Z_t written by lane 0
    const T* zt = a.z + (bh * L + t) * K2;
    const T* qt = a.q + (bh * L + t) * Dh;
    T* st = a.s + (bh * L + t) * K;
    for (int64_t j = 0; j < K; ++j) {
      const T* n = state + j * Dh;
      const T dot = warp.sum([&](int lane, NoState&) {
        T acc = T(0);
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) acc += qt[d] * n[d];
        return acc;
      });
      const T score = a.scale * dot / kmax(zt[j], tiny<T>());
      warp.lead([&] { st[j] = score; });
    }
    warp.sync();
    const auto sm = softmax_of(st, K);
    T* o = a.out + (bh * L + t) * Dh;
    warp.each([&](int lane, NoState&) {
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) o[d] = T(0);
      for (int64_t j = 0; j < K; ++j) {
        const T r = sm.p(j) * a.keep(bh, t, j) / kmax(zt[K + j], tiny<T>());
        const T* n = state + (K + j) * Dh;
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) o[d] += r * n[d];
      }
    });
  }
}

// Slot t of the backward's reverse walk; agg_t is the chunk's recomputed row for t.
template <typename T, class Warp>
SEQREC_KERNEL_FN void backward_slot(Warp& warp, const Args<T>& a, int64_t bh, int64_t t, const T* agg_t) {
  const int64_t b = bh / a.H, h = bh - b * a.H, K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L, D = a.H * Dh;
  const bool real = !a.pad[b * L + t];
  const T* mt = a.m + (bh * L + t) * K2;
  const T* mn = a.m + (bh * L + t + 1) * K2;  // read only when t + 1 < L
  const T* zt = a.z + (bh * L + t) * K2;
  const T* qt = a.q + (bh * L + t) * Dh;
  const T* g = a.grad + (bh * L + t) * Dh;
  const T* at = a.a + (b * L + t) * K2;
  const auto sm = softmax_of(a.s + (bh * L + t) * K, K);
  T* dp = a.dp + bh * K;
  // c of slot t + 1 (zeros at the last slot) and of slot t, by parity.
  const T* c_next = a.carry_c + (bh * 2 + ((t + 1) & 1)) * K2;
  T* c_here = a.carry_c + (bh * 2 + (t & 1)) * K2;
  T* U = a.carry + bh * K2 * Dh;
  T* gq = a.gq + (bh * L + t) * Dh;
  T* gk = a.gk + (b * L + t) * D + h * Dh;
  T* gv = a.gv + (b * L + t) * D + h * Dh;

  for (int64_t j = 0; j < K; ++j) {
    const T* aggv = agg_t + (K + j) * Dh;
    const T dpj = warp.sum([&](int lane, NoState&) {
      T acc = T(0);
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) acc += g[d] * aggv[d];
      return acc;
    });
    warp.lead([&] { dp[j] = dpj; });
  }
  warp.sync();
  T sig = T(0);
  for (int64_t j = 0; j < K; ++j) sig += sm.p(j) * a.keep(bh, t, j) * dp[j];
  auto ds = [&](int64_t j) { return sm.p(j) * (a.keep(bh, t, j) * dp[j] - sig); };
  warp.each([&](int lane, NoState&) {
    for (int64_t d = lane; d < Dh; d += Warp::kLanes) gq[d] = gk[d] = gv[d] = T(0);
    for (int64_t j = 0; j < K; ++j) {  // one softmax term per interest, then its dims
      const T c = a.scale * ds(j);
      const T* ag = agg_t + j * Dh;
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) gq[d] += c * ag[d];
    }
  });

  for (int64_t j = 0; j < K2; ++j) {
    T* u = U + j * Dh;
    const bool key = j < K;
    // G_t[j] = coef · (q_t or g_t).
    const T coef = key ? a.scale * ds(j) : sm.p(j - K) * a.keep(bh, t, j - K);
    const T* src = key ? qt : g;
    if (mt[j] == -kinf<T>()) {  // no real slot up to t: nothing before it to pass anything to
      warp.each([&](int lane, NoState&) {
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) u[d] = T(0);
      });
      warp.lead([&] {
        c_here[j] = T(0);
        a.ga[(bh * L + t) * K2 + j] = T(0);
      });
      continue;
    }
    const T f = t + 1 < L ? kexp(mt[j] - mn[j]) : T(0);
    const T inv_z = T(1) / zt[j];  // Z_t >= 1 once a real slot was seen (the maximum's weight is 1)
    const T* ag = agg_t + j * Dh;
    const T gdot = warp.sum([&](int lane, NoState&) {
      T acc = T(0);
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) acc += coef * src[d] * ag[d];
      return acc;
    });
    const T c = gdot * inv_z + f * c_next[j];
    warp.each([&](int lane, NoState&) {
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) u[d] = coef * src[d] * inv_z + f * u[d];
    });
    T da = T(0);
    if (real) {
      const T w = kexp(at[j] - mt[j]);
      const T* x = (key ? a.k : a.v) + (b * L + t) * D + h * Dh;
      T* gx = key ? gk : gv;
      const T xdot = warp.sum([&](int lane, NoState&) {
        T acc = T(0);
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) acc += x[d] * u[d];
        return acc;
      });
      da = w * (xdot - c);
      warp.each([&](int lane, NoState&) {
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) gx[d] += w * u[d];
      });
    }
    warp.lead([&] {
      c_here[j] = c;
      a.ga[(bh * L + t) * K2 + j] = da;
    });
  }
  warp.sync();  // c_here and dp read by every lane before the next slot writes them
}

// Backward of warp row bh: gq, this head's dims of gk and gv, and its share of ga.
template <typename T, class Warp>
SEQREC_KERNEL_FN void backward_row(Warp& warp, const Args<T>& a, int64_t bh) {
  const int64_t K2 = 2 * a.K, Dh = a.Dh, L = a.L, C = a.C;
  const int64_t chunks = (L + C - 1) / C;
  T* state = a.state + bh * K2 * Dh;
  T* U = a.carry + bh * K2 * Dh;
  T* agg = a.agg + bh * C * K2 * Dh;
  copy_owned<T>(warp, U, nullptr, K2, Dh);
  warp.lead([&] {
    for (int64_t i = 0; i < 2 * K2; ++i) a.carry_c[bh * 2 * K2 + i] = T(0);
  });
  warp.sync();
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t t0 = c * C, t1 = t0 + C < L ? t0 + C : L;
    copy_owned<T>(warp, state, a.ckpt + (bh * chunks + c) * K2 * Dh, K2, Dh);
    for (int64_t t = t0; t < t1; ++t) {
      advance<T>(warp, a, bh, t, /*record=*/false);
      const T* zt = a.z + (bh * L + t) * K2;
      T* row = agg + (t - t0) * K2 * Dh;
      warp.each([&](int lane, NoState&) {
        for (int64_t j = 0; j < K2; ++j) {
          const T inv = T(1) / kmax(zt[j], tiny<T>());
          for (int64_t d = lane; d < Dh; d += Warp::kLanes) row[j * Dh + d] = state[j * Dh + d] * inv;
        }
      });
    }
    for (int64_t t = t1 - 1; t >= t0; --t) backward_slot<T>(warp, a, bh, t, agg + (t - t0) * K2 * Dh);
  }
}

// The forward (backward = false) or backward kernel on the CPU, row by row.
template <typename T>
void emulate(const Args<T>& a, bool backward) {
  for (int64_t bh = 0; bh < a.B * a.H; ++bh) {
    EmulatedWarp<NoState> warp;
    if (backward)
      backward_row<T>(warp, a, bh);
    else
      forward_row<T>(warp, a, bh);
  }
}

}  // namespace seqrec::ops::cuda::interest_kernel
