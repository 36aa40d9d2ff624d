#pragma once
// The body of LightSANs' causal interest attention on a CUDA device (interest_attention.cu),
// written once for nvcc and the host compiler (ops/kernel_common.h): the device runs it with one
// warp per (sequence, head), and emulate() runs the same functions on the CPU with an emulated
// warp (CausalInterestAttention.CudaKernelLogicMatchesReference). The CPU runs the same
// arithmetic over groups of rows (interest_groups_cpu.h). No Torch and no CUDA headers.
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
// Scalars every lane needs are computed once and read from memory after a warp sync: a slot's
// per-interest factors (m, Z, exp(m_{t-1} - m_t), the weights, the softmax's probabilities) one
// interest per lane, into the row's scratch (Slot); the scores, dp' and the carried c by lane 0
// after a warp sum. The softmax's maximum and normaliser are warp reductions. Each lane owns the
// dims d = lane, lane + 32, ... of the head in the state, the carries and the gradients of k, v
// and q. Where the host compiler runs these functions (the emulated warp) the loops are plain;
// the exps are kexp_nonpositive's.
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
  T* slot;          // scratch: [BH, 7K], a row's per-slot scalars (Slot)
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

// A row's per-slot scalars, each computed once by one lane into the row's scratch (Args::slot,
// [BH, 7K]) and read by every lane after a sync.
template <typename T>
struct Slot {
  T* e;   // [2K] forward: exp(m_{t-1} - m_t); backward: the carry factor exp(m_t - m_{t+1})
  T* w;   // [2K] exp(a[t, j] - m_t) at a real slot, 0 at a padded one
  T* p;   // [K]  forward: p_j m_j / Z^v_j (the output's weights); backward: p_j m_j
  T* dp;  // [K]  backward: dp'_j = g_t · aggv_t[j]
  T* ds;  // [K]  backward: ds_j / sqrt(Dh)
};

template <typename T>
SEQREC_KERNEL_FN Slot<T> slot_of(const Args<T>& a, int64_t bh) {
  T* r = a.slot + bh * 7 * a.K;
  return {r, r + 2 * a.K, r + 4 * a.K, r + 5 * a.K, r + 6 * a.K};
}

// Slot t's step of every interest of both sides: state N_{t-1} -> N_t. With `record` (the
// forward) m_t and Z_t are computed and written; without (the backward's recompute) they are read.
// The caller syncs before the lanes read m_t or Z_t.
template <typename T, class Warp>
SEQREC_KERNEL_FN void advance(Warp& warp, const Args<T>& a, const Slot<T>& sl, int64_t bh, int64_t t, bool record) {
  const int64_t b = bh / a.H, h = bh - b * a.H, K = a.K, K2 = 2 * K, D = a.H * a.Dh, Dh = a.Dh;
  const bool real = !a.pad[b * a.L + t];
  const T* at = a.a + (b * a.L + t) * K2;
  const T* mp = a.m + (bh * a.L + t - 1) * K2;  // read only when t > 0
  const T* zp = a.z + (bh * a.L + t - 1) * K2;
  T* mt = a.m + (bh * a.L + t) * K2;
  T* zt = a.z + (bh * a.L + t) * K2;
  // The interests' factors, one interest per lane (the arguments of the exps are chosen so that
  // none is NaN or positive, for the loop's branch-free form).
  warp.each([&](int lane, NoState&) {
    for (int64_t j = lane; j < K2; j += Warp::kLanes) {
      const T m_prev = t > 0 ? mp[j] : -kinf<T>();
      const T m_new = record ? (real && at[j] > m_prev ? at[j] : m_prev) : mt[j];
      const bool had = m_prev != -kinf<T>(), seen = m_new != -kinf<T>();
      const T e = kexp_nonpositive(had ? m_prev - m_new : T(0));
      const T w = kexp_nonpositive(real ? at[j] - m_new : T(0));
      const T e_j = had ? e : (seen ? T(0) : T(1));
      const T w_j = real ? w : T(0);
      sl.e[j] = e_j;
      sl.w[j] = w_j;
      if (record) {
        mt[j] = m_new;
        zt[j] = seen ? (t > 0 ? zp[j] : T(0)) * e_j + w_j : T(0);
      }
    }
  });
  warp.sync();
  const T* kx = a.k + (b * a.L + t) * D + h * Dh;
  const T* vx = a.v + (b * a.L + t) * D + h * Dh;
  T* n = a.state + bh * K2 * Dh;
  warp.each([&](int lane, NoState&) {
    for (int64_t j = 0; j < K2; ++j) {
      const T e = sl.e[j], w = sl.w[j];
      const T* x = j < K ? kx : vx;
      T* nj = n + j * Dh;
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) nj[d] = nj[d] * e + w * x[d];
    }
  });
}

// The softmax of a slot's K scores s: its maximum and normaliser, as every lane holds them.
template <typename T>
struct Softmax {
  T top, den;
};

template <typename T, class Warp>
SEQREC_KERNEL_FN Softmax<T> softmax_of(Warp& warp, const T* s, int64_t K) {
  Softmax<T> sm;
  sm.top = warp.max([&](int lane, NoState&) {
    T top = -kinf<T>();
    for (int64_t j = lane; j < K; j += Warp::kLanes) top = kmax(top, s[j]);
    return top;
  });
  sm.den = warp.sum([&](int lane, NoState&) {
    T den = T(0);
    for (int64_t j = lane; j < K; j += Warp::kLanes) den += kexp_nonpositive(s[j] - sm.top);
    return den;
  });
  return sm;
}

// x · y over the dims of a head, as every lane holds it. Each lane sums its dims in four
// interleaved partial sums (d, d + 4·kLanes, ... in the first); the CPU's groups sum each row's
// dims in the same order (interest_groups_cpu.h).
template <typename T, class Warp>
SEQREC_KERNEL_FN T head_dot(Warp& warp, const T* x, const T* y, int64_t Dh) {
  return warp.sum([&](int lane, NoState&) {
    constexpr int64_t S = Warp::kLanes;
    T a0 = T(0), a1 = T(0), a2 = T(0), a3 = T(0);
    int64_t d = lane;
    for (; d + 3 * S < Dh; d += 4 * S) {
      a0 += x[d] * y[d];
      a1 += x[d + S] * y[d + S];
      a2 += x[d + 2 * S] * y[d + 2 * S];
      a3 += x[d + 3 * S] * y[d + 3 * S];
    }
    for (; d < Dh; d += S) a0 += x[d] * y[d];
    return (a0 + a1) + (a2 + a3);
  });
}

// Forward of warp row bh = b·H + h: every slot's output, m, Z and scores, and the checkpoints.
template <typename T, class Warp>
SEQREC_KERNEL_FN void forward_row(Warp& warp, const Args<T>& a, int64_t bh) {
  const int64_t K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L;
  const int64_t chunks = (L + a.C - 1) / a.C;
  const Slot<T> sl = slot_of(a, bh);
  T* state = a.state + bh * K2 * Dh;
  copy_owned<T>(warp, state, nullptr, K2, Dh);
  for (int64_t t = 0; t < L; ++t) {
    if (a.ckpt && t % a.C == 0) {
      copy_owned<T>(warp, a.ckpt + (bh * chunks + t / a.C) * K2 * Dh, state, K2, Dh);
    }
    advance<T>(warp, a, sl, bh, t, /*record=*/true);
    warp.sync();  // m_t, Z_t written by their lanes
    const T* zt = a.z + (bh * L + t) * K2;
    const T* qt = a.q + (bh * L + t) * Dh;
    T* st = a.s + (bh * L + t) * K;
    for (int64_t j = 0; j < K; ++j) {
      const T score = a.scale * head_dot(warp, qt, state + j * Dh, Dh) / kmax(zt[j], tiny<T>());
      warp.lead([&] { st[j] = score; });
    }
    warp.sync();
    const auto sm = softmax_of(warp, st, K);
    warp.each([&](int lane, NoState&) {
      for (int64_t j = lane; j < K; j += Warp::kLanes)
        sl.p[j] = kexp_nonpositive(st[j] - sm.top) / sm.den * a.keep(bh, t, j) / kmax(zt[K + j], tiny<T>());
    });
    warp.sync();
    T* o = a.out + (bh * L + t) * Dh;
    warp.each([&](int lane, NoState&) {
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) o[d] = T(0);
      for (int64_t j = 0; j < K; ++j) {
        const T r = sl.p[j];
        const T* n = state + (K + j) * Dh;
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) o[d] += r * n[d];
      }
    });
    warp.sync();  // sl read by every lane before the next slot writes it
  }
}

// Slot t of the backward's reverse walk; agg_t is the chunk's recomputed row for t.
template <typename T, class Warp>
SEQREC_KERNEL_FN void backward_slot(Warp& warp, const Args<T>& a, const Slot<T>& sl, int64_t bh, int64_t t,
                                    const T* agg_t) {
  const int64_t b = bh / a.H, h = bh - b * a.H, K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L, D = a.H * Dh;
  const bool real = !a.pad[b * L + t];
  const T* mt = a.m + (bh * L + t) * K2;
  const T* mn = a.m + (bh * L + t + 1) * K2;  // read only when t + 1 < L
  const T* zt = a.z + (bh * L + t) * K2;
  const T* qt = a.q + (bh * L + t) * Dh;
  const T* g = a.grad + (bh * L + t) * Dh;
  const T* at = a.a + (b * L + t) * K2;
  const T* st = a.s + (bh * L + t) * K;
  // c of slot t + 1 (zeros at the last slot) and of slot t, by parity.
  const T* c_next = a.carry_c + (bh * 2 + ((t + 1) & 1)) * K2;
  T* c_here = a.carry_c + (bh * 2 + (t & 1)) * K2;
  T* U = a.carry + bh * K2 * Dh;
  T* gq = a.gq + (bh * L + t) * Dh;
  T* gk = a.gk + (b * L + t) * D + h * Dh;
  T* gv = a.gv + (b * L + t) * D + h * Dh;

  for (int64_t j = 0; j < K; ++j) {
    const T dpj = head_dot(warp, g, agg_t + (K + j) * Dh, Dh);
    warp.lead([&] { sl.dp[j] = dpj; });
  }
  // The carry factors and weights, one interest per lane (no NaN or positive exp arguments).
  const bool last = t + 1 >= L;
  warp.each([&](int lane, NoState&) {
    for (int64_t j = lane; j < K2; j += Warp::kLanes) {
      const bool seen = mt[j] != -kinf<T>();
      const T f = kexp_nonpositive(seen && !last ? mt[j] - mn[j] : T(0));
      const T w = kexp_nonpositive(real ? at[j] - mt[j] : T(0));
      sl.e[j] = seen && !last ? f : T(0);
      sl.w[j] = real ? w : T(0);
    }
  });
  const auto sm = softmax_of(warp, st, K);
  warp.each([&](int lane, NoState&) {
    for (int64_t j = lane; j < K; j += Warp::kLanes) {
      const T p = kexp_nonpositive(st[j] - sm.top) / sm.den;
      sl.p[j] = p * a.keep(bh, t, j);
      sl.ds[j] = p;  // this lane's until it turns it into ds below
    }
  });
  warp.sync();  // dp and p
  const T sig = warp.sum([&](int lane, NoState&) {
    T acc = T(0);
    for (int64_t j = lane; j < K; j += Warp::kLanes) acc += sl.p[j] * sl.dp[j];
    return acc;
  });
  warp.each([&](int lane, NoState&) {
    for (int64_t j = lane; j < K; j += Warp::kLanes)
      sl.ds[j] = a.scale * sl.ds[j] * (a.keep(bh, t, j) * sl.dp[j] - sig);
  });
  warp.sync();  // ds
  warp.each([&](int lane, NoState&) {
    for (int64_t d = lane; d < Dh; d += Warp::kLanes) gq[d] = gk[d] = gv[d] = T(0);
    for (int64_t j = 0; j < K; ++j) {  // one softmax term per interest, then its dims
      const T c = sl.ds[j];
      const T* ag = agg_t + j * Dh;
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) gq[d] += c * ag[d];
    }
  });

  for (int64_t j = 0; j < K2; ++j) {
    T* u = U + j * Dh;
    const bool key = j < K;
    // G_t[j] = coef · (q_t or g_t).
    const T coef = key ? sl.ds[j] : sl.p[j - K];
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
    const T f = sl.e[j];
    const T inv_z = T(1) / zt[j];  // Z_t >= 1 once a real slot was seen (the maximum's weight is 1)
    const T* ag = agg_t + j * Dh;
    const T c = coef * head_dot(warp, src, ag, Dh) * inv_z + f * c_next[j];
    const T cz = coef * inv_z;
    warp.each([&](int lane, NoState&) {
      for (int64_t d = lane; d < Dh; d += Warp::kLanes) u[d] = cz * src[d] + f * u[d];
    });
    T da = T(0);
    if (real) {
      const T w = sl.w[j];
      const T* x = (key ? a.k : a.v) + (b * L + t) * D + h * Dh;
      T* gx = key ? gk : gv;
      da = w * (head_dot(warp, x, u, Dh) - c);
      warp.each([&](int lane, NoState&) {
        for (int64_t d = lane; d < Dh; d += Warp::kLanes) gx[d] += w * u[d];
      });
    }
    warp.lead([&] {
      c_here[j] = c;
      a.ga[(bh * L + t) * K2 + j] = da;
    });
  }
  warp.sync();  // c_here and sl read by every lane before the next slot writes them
}

// Backward of warp row bh: gq, this head's dims of gk and gv, and its share of ga.
template <typename T, class Warp>
SEQREC_KERNEL_FN void backward_row(Warp& warp, const Args<T>& a, int64_t bh) {
  const int64_t K2 = 2 * a.K, Dh = a.Dh, L = a.L, C = a.C;
  const int64_t chunks = (L + C - 1) / C;
  const Slot<T> sl = slot_of(a, bh);
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
      advance<T>(warp, a, sl, bh, t, /*record=*/false);
      const T* zt = a.z + (bh * L + t) * K2;
      T* row = agg + (t - t0) * K2 * Dh;
      warp.each([&](int lane, NoState&) {
        for (int64_t j = 0; j < K2; ++j) {
          const T inv = T(1) / kmax(zt[j], tiny<T>());
          for (int64_t d = lane; d < Dh; d += Warp::kLanes) row[j * Dh + d] = state[j * Dh + d] * inv;
        }
      });
      warp.sync();  // sl read by every lane before the next slot's advance writes it
    }
    for (int64_t t = t1 - 1; t >= t0; --t) backward_slot<T>(warp, a, sl, bh, t, agg + (t - t0) * K2 * Dh);
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
