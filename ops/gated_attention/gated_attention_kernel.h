#pragma once
// The body of FLASH4Rec's fused gated attention (A'·V of gated_attention.h's explicit path:
// either form, Top-K attention dropout with one rescale per row), written once for nvcc and the
// host compiler (ops/kernel_common.h). One warp per row: the forward and the backward's query
// pass take a query row (sequence, head, slot i), the backward's key pass a key row (.., slot j),
// so that every gradient row has one writer and there are no atomics. The device runs them in
// gated_attention.cu; the CPU can run them with a one-lane warp (gated_attention_fused.cpp; for
// the tests of the host glue: on the CPU the models run the reference, faster there), and the
// tests with an emulated warp. No Torch and no CUDA headers here. Nothing of size L x L is
// made: a row's scores live in its warp's scratch of 2·L values (shared memory on the device).
//
// Per query row i (b, h omitted), V(i) its visible keys (real, and j <= i when causal):
//   x_j = scale·q_i·k_j (softmax) or 1 + q̂_i·k̂_j (cosine, x̂ = x / max(||x||, eps)),
//   w_j = exp(x_j - m) (m = max x) or x_j,  Z = sum w (cosine: max(sum w, eps)),  P_j = w_j / Z.
//   Top-K dropout (training, p > 0, topk > 0): S = the topk largest P_j (ties: the lower slot),
//   M_j = 0 where j in S and the keep bit of flat index (row·L + j) is off (dropout_mask's bits
//   over [B, H, L, L]), T = sum P, K = sum M·P; f = T / max(K, eps), unless every visible entry
//   was dropped (K <= 0 < T: the row is kept whole, M = 1, f = 1). Without it M = 1, f = 1.
//   out_i = f·sum_j M_j·P_j·v_j.
// Backward, g_j = dout_i·v_j, G = sum M·P·g, Kc = max(K, eps):
//   dP_j = M_j·(f·g_j - G·T/K²·[K >= eps]) + G/Kc   (dropout active; else dP_j = g_j),
//   S2 = sum P·dP;  softmax: dx_j = P_j·(dP_j - S2),  cosine: dw_j = (dP_j - S2) / Z (dP_j / eps
//   when sum w < eps); then through the scores, and through the cosine form's norms
//   (dx = (dx̂ - x̂·(x̂·dx̂)) / ||x||, or dx̂ / eps when ||x|| < eps).
#include <cstdint>
#include <vector>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda::gated_kernel {

// Widest q/k (s) and value (e) rows the kernels take; wider ones run the reference.
constexpr int64_t kMaxDim = 256;
constexpr double kEps = 1e-12;  // as the reference's

// Per-row scalars: the forward writes kM..kActive, the backward's query pass kA..kS2 (which
// its key pass reads).
enum Stat : int64_t { kM, kZ, kZraw, kF, kT, kK, kActive, kA, kB, kS2, kStats };

template <typename T>
struct Args {
  const T* q;        // [B, H, L, s]
  const T* k;        // [B, H, L, s]
  const T* v;        // [B, H, L, e]
  const bool* pad;   // [B, L], true at padded slots
  const T* qn;       // cosine form: [B, H, L] ||q||₂ (nullptr in the softmax form)
  const T* kn;       // cosine form: [B, H, L] ||k||₂
  T* out;            // forward: [B, H, L, e]
  T* stats;          // [B·H·L, kStats]
  int32_t* dropped;  // [B·H·L, topk]: the dropped key slots of each row, -1 after the last;
                     // nullptr without Top-K dropout
  const T* grad;     // backward: [B, H, L, e]
  T* gq;             // backward: [B, H, L, s], written
  T* gk;             // backward: [B, H, L, s], written
  T* gv;             // backward: [B, H, L, e], written
  int64_t B, H, L, s, e, topk;
  T scale;           // the softmax form's 1 / sqrt(s)
  bool causal, cosine;
  uint64_t hash_base;   // mix64(seed ^ φ) of the call's seed
  uint32_t threshold;   // drop when the 16-bit lane is below it; 0: no Top-K dropout

  SEQREC_KERNEL_FN bool dropout() const { return threshold > 0 && topk > 0 && dropped != nullptr; }
};

struct NoState {};

// SplitMix64's finaliser (ops::mix64), for the device too.
SEQREC_KERNEL_FN uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether dropout_mask's bit drops flat element `idx`, for base = mix(seed ^ φ) and threshold =
// round(p · 2^16): its 16-bit lane idx % 4 of mix(base + (idx / 4) · φ) is below the threshold.
SEQREC_KERNEL_FN bool drops_element(uint64_t base, uint32_t threshold, int64_t idx) {
  const uint64_t h = mix(base + static_cast<uint64_t>(idx >> 2) * 0x9E3779B97F4A7C15ull);
  return static_cast<uint32_t>((h >> (16 * (idx & 3))) & 0xFFFFu) < threshold;
}

// The same for flat element `idx` of the call's [B, H, L, L].
template <typename T>
SEQREC_KERNEL_FN bool drops(const Args<T>& a, int64_t idx) {
  return drops_element(a.hash_base, a.threshold, idx);
}

// A lane's dot product: four interleaved partial sums, independent chains.
template <typename T>
SEQREC_KERNEL_FN T dot(const T* x, const T* y, int64_t n) {
  T a0 = T(0), a1 = T(0), a2 = T(0), a3 = T(0);
  int64_t d = 0;
  for (; d + 3 < n; d += 4) {
    a0 += x[d] * y[d];
    a1 += x[d + 1] * y[d + 1];
    a2 += x[d + 2] * y[d + 2];
    a3 += x[d + 3] * y[d + 3];
  }
  for (; d < n; ++d) a0 += x[d] * y[d];
  return (a0 + a1) + (a2 + a3);
}

template <typename T>
SEQREC_KERNEL_FN T inv_norm(T n) {
  return T(1) / kmax(n, T(kEps));
}

// x_ij of the definitions for query slot i and key slot j of sequence-head bh.
template <typename T>
SEQREC_KERNEL_FN T score(const Args<T>& a, int64_t bh, int64_t i, int64_t j) {
  const T qk = dot(a.q + (bh * a.L + i) * a.s, a.k + (bh * a.L + j) * a.s, a.s);
  if (!a.cosine) return qk * a.scale;
  return T(1) + qk * inv_norm(a.qn[bh * a.L + i]) * inv_norm(a.kn[bh * a.L + j]);
}

// P_ij from x_ij and the row's saved m and Z.
template <typename T>
SEQREC_KERNEL_FN T prob(const Args<T>& a, const T* st, T x) {
  return (a.cosine ? x : kexp(x - st[kM])) / st[kZ];
}

SEQREC_KERNEL_FN bool in_list(const int32_t* list, int64_t n, int64_t j) {
  for (int64_t r = 0; r < n && list[r] >= 0; ++r)
    if (list[r] == j) return true;
  return false;
}

// Forward of query row (b·H + h)·L + i: its output, stats and dropped list. sc: L scratch values.
template <typename T, class Warp>
SEQREC_KERNEL_FN void forward_row(Warp& warp, const Args<T>& a, int64_t row, T* sc) {
  constexpr int64_t S = Warp::kLanes;
  const int64_t L = a.L, bh = row / L, i = row - bh * L, e = a.e;
  const bool* pad = a.pad + (bh / a.H) * L;
  T* o = a.out + row * e;
  T* st = a.stats + row * kStats;
  int32_t* drop = a.dropout() ? a.dropped + row * a.topk : nullptr;
  if (pad[i]) {
    warp.each([&](int lane, NoState&) {
      for (int64_t k = lane; k < e; k += S) o[k] = T(0);
    });
    warp.lead([&] {
      for (int64_t n = 0; n < kStats; ++n) st[n] = T(0);
      st[kZ] = st[kZraw] = st[kF] = T(1);
      if (drop) drop[0] = -1;
    });
    return;
  }
  const int64_t hi = a.causal ? i + 1 : L;  // keys [0, hi), padded ones skipped
  const T top = warp.max([&](int lane, NoState&) {
    T m = -kinf<T>();
    for (int64_t j = lane; j < hi; j += S) {
      if (pad[j]) continue;
      sc[j] = score(a, bh, i, j);
      m = kmax(m, sc[j]);
    }
    return m;
  });
  const T m = a.cosine ? T(0) : top;
  const T zraw = warp.sum([&](int lane, NoState&) {
    T z = T(0);
    for (int64_t j = lane; j < hi; j += S) {
      if (pad[j]) continue;
      sc[j] = a.cosine ? sc[j] : kexp(sc[j] - m);
      z += sc[j];
    }
    return z;
  });
  const T z = a.cosine ? kmax(zraw, T(kEps)) : zraw;
  const T total = warp.sum([&](int lane, NoState&) {
    T t = T(0);
    for (int64_t j = lane; j < hi; j += S) {
      if (pad[j]) continue;
      sc[j] = sc[j] / z;
      t += sc[j];
    }
    return t;
  });
  T f = T(1), kept = total;
  bool active = false;
  if (drop) {
    // The topk largest P_j, one per round: each round's pick is the largest entry below the
    // previous pick in the order (P descending, slot ascending); every lane learns it.
    T prev_p = kinf<T>();
    int64_t prev_j = -1, n_drop = 0;
    for (int64_t r = 0; r < a.topk; ++r) {
      auto below = [&](int64_t j) { return sc[j] < prev_p || (sc[j] == prev_p && j > prev_j); };
      const T best = warp.max([&](int lane, NoState&) {
        T b = -kinf<T>();
        for (int64_t j = lane; j < hi; j += S)
          if (!pad[j] && below(j)) b = kmax(b, sc[j]);
        return b;
      });
      if (best == -kinf<T>()) break;  // fewer than topk visible keys: every one is in S
      const T neg_j = warp.max([&](int lane, NoState&) {
        T b = -kinf<T>();
        for (int64_t j = lane; j < hi; j += S)
          if (!pad[j] && below(j) && sc[j] == best) b = kmax(b, static_cast<T>(-j));
        return b;
      });
      prev_p = best;
      prev_j = static_cast<int64_t>(-neg_j);
      if (drops(a, row * L + prev_j)) {
        const int64_t slot = n_drop++;
        const int32_t picked = static_cast<int32_t>(prev_j);
        warp.lead([&] { drop[slot] = picked; });
      }
    }
    warp.lead([&] {
      if (n_drop < a.topk) drop[n_drop] = -1;
    });
    warp.sync();
    if (n_drop > 0) {
      kept = warp.sum([&](int lane, NoState&) {
        T t = T(0);
        for (int64_t j = lane; j < hi; j += S)
          if (!pad[j] && !in_list(drop, a.topk, j)) t += sc[j];
        return t;
      });
      if (kept <= T(0) && total > T(0)) {  // everything dropped: the row is kept whole
        kept = total;
        warp.lead([&] { drop[0] = -1; });
      } else {
        active = true;
        f = total / kmax(kept, T(kEps));
        warp.each([&](int lane, NoState&) {
          for (int64_t j = lane; j < hi; j += S)
            if (!pad[j] && in_list(drop, a.topk, j)) sc[j] = T(0);
        });
      }
    }
  }
  warp.sync();
  warp.each([&](int lane, NoState&) {
    for (int64_t k = lane; k < e; k += S) o[k] = T(0);
    for (int64_t j = 0; j < hi; ++j) {
      if (pad[j]) continue;
      const T w = sc[j] * f;
      const T* vj = a.v + (bh * L + j) * e;
      for (int64_t k = lane; k < e; k += S) o[k] += w * vj[k];
    }
  });
  warp.lead([&] {
    st[kM] = m;
    st[kZ] = z;
    st[kZraw] = zraw;
    st[kF] = f;
    st[kT] = total;
    st[kK] = kept;
    st[kActive] = active ? T(1) : T(0);
  });
}

// dP_ij of the definitions from g_ij, M_ij and the row's stats.
template <typename T>
SEQREC_KERNEL_FN T prob_grad(const T* st, T g, bool dropped) {
  if (st[kActive] == T(0)) return g;
  return (dropped ? T(0) : st[kF] * g - st[kB]) + st[kA];
}

// The gradient of the row's normalisation: dx_ij (softmax, the scale included) or dw_ij
// (cosine) from P_ij and dP_ij.
template <typename T>
SEQREC_KERNEL_FN T score_grad(const Args<T>& a, const T* st, T p, T dp) {
  if (!a.cosine) return a.scale * p * (dp - st[kS2]);
  return st[kZraw] < T(kEps) ? dp / T(kEps) : (dp - st[kS2]) / st[kZ];
}

// y[k] = (y[k] - x̂[k]·(x̂·y)) / ||x|| over the lane's entries of a row of n, x̂ = x / ||x|| (or
// y / eps when ||x|| < eps): an L2 normalisation's backward, y the gradient of x̂.
template <typename T, class Warp>
SEQREC_KERNEL_FN void norm_backward(Warp& warp, const T* x, T nx, T* y, int64_t n) {
  constexpr int64_t S = Warp::kLanes;
  const T inv = inv_norm(nx);
  if (nx < T(kEps)) {
    warp.each([&](int lane, NoState&) {
      for (int64_t k = lane; k < n; k += S) y[k] *= inv;
    });
    return;
  }
  const T xy = warp.sum([&](int lane, NoState&) {
    T t = T(0);
    for (int64_t k = lane; k < n; k += S) t += x[k] * inv * y[k];
    return t;
  });
  warp.each([&](int lane, NoState&) {
    for (int64_t k = lane; k < n; k += S) y[k] = (y[k] - x[k] * inv * xy) * inv;
  });
}

// The backward's query pass over row (b·H + h)·L + i: gq's row, and the stats kA, kB, kS2 the
// key pass needs. sc: 2·L scratch values.
template <typename T, class Warp>
SEQREC_KERNEL_FN void query_row(Warp& warp, const Args<T>& a, int64_t row, T* sc) {
  constexpr int64_t S = Warp::kLanes;
  const int64_t L = a.L, bh = row / L, i = row - bh * L, s = a.s, e = a.e;
  const bool* pad = a.pad + (bh / a.H) * L;
  T* st = a.stats + row * kStats;
  T* gq = a.gq + row * s;
  if (pad[i]) {  // output 0: no gradient in or out
    warp.each([&](int lane, NoState&) {
      for (int64_t k = lane; k < s; k += S) gq[k] = T(0);
    });
    return;
  }
  const int32_t* drop = a.dropout() ? a.dropped + row * a.topk : nullptr;
  const T* g = a.grad + row * e;
  T* p = sc;       // P_j
  T* dp = sc + L;  // g_j, then dP_j, then dx_j
  const int64_t hi = a.causal ? i + 1 : L;
  const bool active = st[kActive] != T(0);
  const T gsum = warp.sum([&](int lane, NoState&) {
    T t = T(0);
    for (int64_t j = lane; j < hi; j += S) {
      if (pad[j]) continue;
      p[j] = prob(a, st, score(a, bh, i, j));
      dp[j] = dot(g, a.v + (bh * L + j) * e, e);
      if (!(drop && in_list(drop, a.topk, j))) t += p[j] * dp[j];
    }
    return t;
  });
  if (active) {
    const T kept = st[kK], kc = kmax(kept, T(kEps));
    const T ra = gsum / kc, rb = kept >= T(kEps) ? gsum * st[kT] / (kc * kc) : T(0);
    warp.lead([&] {
      st[kA] = ra;
      st[kB] = rb;
    });
    warp.sync();
  }
  const T s2 = warp.sum([&](int lane, NoState&) {
    T t = T(0);
    for (int64_t j = lane; j < hi; j += S) {
      if (pad[j]) continue;
      dp[j] = prob_grad(st, dp[j], active && in_list(drop, a.topk, j));
      t += p[j] * dp[j];
    }
    return t;
  });
  warp.lead([&] { st[kS2] = s2; });
  warp.sync();
  warp.each([&](int lane, NoState&) {
    for (int64_t j = lane; j < hi; j += S)
      if (!pad[j]) dp[j] = score_grad(a, st, p[j], dp[j]);
  });
  warp.sync();
  // gq_i = sum_j dx_j·k_j (cosine: times 1 / ||k_j||, then through q's norm).
  warp.each([&](int lane, NoState&) {
    for (int64_t k = lane; k < s; k += S) gq[k] = T(0);
    for (int64_t j = 0; j < hi; ++j) {
      if (pad[j]) continue;
      const T c = a.cosine ? dp[j] * inv_norm(a.kn[bh * L + j]) : dp[j];
      const T* kj = a.k + (bh * L + j) * s;
      for (int64_t k = lane; k < s; k += S) gq[k] += c * kj[k];
    }
  });
  if (a.cosine) {
    warp.sync();
    norm_backward(warp, a.q + row * s, a.qn[row], gq, s);
  }
}

// The backward's key pass over row (b·H + h)·L + j: gk's and gv's rows, from every query that
// sees key j (after the query pass of the whole batch). sc: 2·L scratch values.
template <typename T, class Warp>
SEQREC_KERNEL_FN void key_row(Warp& warp, const Args<T>& a, int64_t row, T* sc) {
  constexpr int64_t S = Warp::kLanes;
  const int64_t L = a.L, bh = row / L, j = row - bh * L, s = a.s, e = a.e;
  const bool* pad = a.pad + (bh / a.H) * L;
  T* gk = a.gk + row * s;
  T* gv = a.gv + row * e;
  if (pad[j]) {  // seen by no query
    warp.each([&](int lane, NoState&) {
      for (int64_t k = lane; k < s; k += S) gk[k] = T(0);
      for (int64_t k = lane; k < e; k += S) gv[k] = T(0);
    });
    return;
  }
  T* w = sc;       // A'_ij
  T* dx = sc + L;  // dx_ij (cosine: dw_ij / ||q_i||)
  const int64_t lo = a.causal ? j : 0;
  const T* vj = a.v + row * e;
  warp.each([&](int lane, NoState&) {
    for (int64_t i = lo + lane; i < L; i += S) {
      if (pad[i]) continue;
      const int64_t qrow = bh * L + i;
      const T* st = a.stats + qrow * kStats;
      const bool dj = st[kActive] != T(0) && in_list(a.dropped + qrow * a.topk, a.topk, j);
      const T p = prob(a, st, score(a, bh, i, j));
      const T g = dot(a.grad + qrow * a.e, vj, e);
      w[i] = dj ? T(0) : p * st[kF];
      const T d = score_grad(a, st, p, prob_grad(st, g, dj));
      dx[i] = a.cosine ? d * inv_norm(a.qn[qrow]) : d;
    }
  });
  warp.sync();
  warp.each([&](int lane, NoState&) {
    for (int64_t k = lane; k < e; k += S) gv[k] = T(0);
    for (int64_t k = lane; k < s; k += S) gk[k] = T(0);
    for (int64_t i = lo; i < L; ++i) {
      if (pad[i]) continue;
      const T* gi = a.grad + (bh * L + i) * e;
      const T* qi = a.q + (bh * L + i) * s;
      const T wi = w[i], di = dx[i];
      for (int64_t k = lane; k < e; k += S) gv[k] += wi * gi[k];
      for (int64_t k = lane; k < s; k += S) gk[k] += di * qi[k];
    }
  });
  if (a.cosine) {
    warp.sync();
    norm_backward(warp, a.k + row * s, a.kn[row], gk, s);
  }
}

// The three passes on the CPU with an emulated warp, row by row (for the tests).
template <typename T>
void emulate(const Args<T>& a, bool backward) {
  const int64_t rows = a.B * a.H * a.L;
  std::vector<T> scratch(static_cast<size_t>(2 * a.L));
  T* sc = scratch.data();
  for (int pass = backward ? 1 : 0; pass < (backward ? 3 : 1); ++pass)
    for (int64_t row = 0; row < rows; ++row) {
      EmulatedWarp<NoState> warp;
      if (pass == 0)
        forward_row<T>(warp, a, row, sc);
      else if (pass == 1)
        query_row<T>(warp, a, row, sc);
      else
        key_row<T>(warp, a, row, sc);
    }
}

}  // namespace seqrec::ops::cuda::gated_kernel
