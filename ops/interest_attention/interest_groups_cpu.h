#pragma once
// LightSANs' causal interest scan on the CPU, rows taken a vector's width at a time. The
// arithmetic is interest_attention_kernel.h's (its header derives it): per row (sequence, head)
// and interest, the running maximum m, normaliser Z and weighted sum N of the rows seen so far,
// the query's softmax over its k interests, and the backward's reverse scans U and c. That file
// walks one row slot by slot, its loops over one head's dims or the 2k interests: on the CPU a
// few short vectors each with a remainder, and a chain of dependent scalars per slot, so the walk
// is bound by latency and wider vectors did not help (docs/benchmarks.md). Here a group of R rows
// is walked together, every array laid out with the row innermost ([..., R]): each scalar step of
// the row walk becomes one operation over R independent rows, a whole vector with no remainder,
// and the per-row branches (a padded slot, an interest no real slot has reached yet) become
// selects. Rows past the batch's last fill the last group as all-padding rows.
//
// R is one register of the CPU level the code runs at (ops/cpu_features.h): 16 bytes at the
// baseline (4 floats, 2 doubles), 32 with AVX2 or AVX-512 (8 floats, 4 doubles), or 16 where
// that holds every row of the call; the host lays the groups out at rows_per_group<T>(rows) and
// the functions run at the same level. The values are
// GCC vector types of R lanes, so every step is vector code whatever the loop optimiser makes of
// it (wider than the target's registers, GCC would do the comparisons and selects lane by lane);
// the exps are ops/exp_nonpositive.h's polynomial, lane by lane the same operations. Every
// operation of a row is the row walk's, in its order (the head's dot products in the same four
// interleaved partial sums), so a row's results depend on that row's inputs alone, and a slot's
// on the slots up to it; only the softmax's maximum and normaliser over the k interests are
// summed in interest order here, where the row walk's vectorised reductions may reorder them. No
// Torch and no CUDA headers.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "ops/cpu_features.h"
#include "ops/exp_nonpositive.h"

namespace seqrec::ops::interest_groups {

// The tensors of one call in the group layout, G groups of R rows (row r of group g is row
// g·R + r of [B·H], b·H + h), K interests per side, C slots per checkpoint.
template <typename T>
struct Args {
  const T* q;     // [G, L, Dh, R]
  const T* k;     // [G, L, Dh, R] the row's head's dims of the keys
  const T* v;     // [G, L, Dh, R] and of the values
  const T* a;     // [G, L, 2K, R] the row's sequence's logits: the keys', then the values'
  const T* real;  // [G, L, R] 1 at a real slot, 0 at a padded one
  const T* mask;  // [G, L, K, R] dropout keep factors; nullptr without dropout
  T* out;         // forward: [G, L, Dh, R]
  T* m;           // [G, L, 2K, R] running maxima (forward writes, backward reads)
  T* z;           // [G, L, 2K, R] normalisers (likewise)
  T* s;           // [G, L, K, R] scores (likewise)
  T* ckpt;        // [G, ceil(L / C), 2K, Dh, R] the sums entering each chunk; null: none kept
  const T* grad;  // backward: [G, L, Dh, R]
  T* gq;          // backward: [G, L, Dh, R]
  T* gk;          // backward: [G, L, Dh, R]
  T* gv;          // backward: [G, L, Dh, R]
  T* ga;          // backward: [G, L, 2K, R], this row's (head's) share of the logits' gradient
  int64_t G, L, Dh, K, C, R;
  T scale;  // 1 / sqrt(Dh)

  int64_t chunks() const { return (L + C - 1) / C; }
};

#define SEQREC_GROUP_FN __attribute__((always_inline)) static inline

// The walk for R-row groups of T (R · sizeof(T) = 16 or 32 bytes).
template <typename T, int64_t R>
struct Group {
  typedef T V __attribute__((vector_size(sizeof(T) * R)));  // one value of each of the rows
  typedef decltype(V{} < V{}) M;                             // a comparison's lanes: -1 or 0

  SEQREC_GROUP_FN V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  SEQREC_GROUP_FN void store(T* p, const V& v) { std::memcpy(p, &v, sizeof v); }
  SEQREC_GROUP_FN V splat(T x) { return V{} + x; }
  SEQREC_GROUP_FN V vmax(const V& a, const V& b) { return a < b ? b : a; }  // the row walk's kmax
  SEQREC_GROUP_FN V inf() { return splat(static_cast<T>(HUGE_VAL)); }
  SEQREC_GROUP_FN V tiny() { return splat(static_cast<T>(1e-30)); }  // the row walk's clamp of Z

  // exp(x) for x <= 0, lane by lane ops/exp_nonpositive.h's (float: its polynomial in the same
  // operations; double: std::exp).
  SEQREC_GROUP_FN V exp_nonpositive(V x) {
    if constexpr (std::is_same_v<T, float>) {
      return detail::exp_nonpositive_of(x);
    } else {
      for (int64_t r = 0; r < R; ++r) x[r] = std::exp(x[r]);
      return x;
    }
  }

  // x · y over Dh dims, x and y [Dh, R]: the row walk's head_dot on one lane (four interleaved
  // partial sums, then (a0 + a1) + (a2 + a3)).
  SEQREC_GROUP_FN V dot(const T* x, const T* y, int64_t Dh) {
    V a0{}, a1{}, a2{}, a3{};
    int64_t d = 0;
    for (; d + 3 < Dh; d += 4) {
      const T *x0 = x + d * R, *y0 = y + d * R;
      a0 += load(x0) * load(y0);
      a1 += load(x0 + R) * load(y0 + R);
      a2 += load(x0 + 2 * R) * load(y0 + 2 * R);
      a3 += load(x0 + 3 * R) * load(y0 + 3 * R);
    }
    for (; d < Dh; ++d) a0 += load(x + d * R) * load(y + d * R);
    return (a0 + a1) + (a2 + a3);
  }

  // n zeroed vectors, 64-byte aligned: std::vector does not align GCC's vector types to their
  // width, and the wider levels' code moves them whole.
  class Buffer {
   public:
    explicit Buffer(int64_t n) {
      if (n == 0) return;
      const size_t bytes = (static_cast<size_t>(n) * sizeof(V) + 63) / 64 * 64;
      p_ = static_cast<V*>(std::aligned_alloc(64, bytes));
      if (!p_) throw std::bad_alloc();
      std::memset(static_cast<void*>(p_), 0, bytes);
    }
    ~Buffer() { std::free(p_); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    V& operator[](int64_t i) { return p_[i]; }
    V* data() { return p_; }
    T* raw(int64_t i) { return reinterpret_cast<T*>(p_ + i); }

   private:
    V* p_ = nullptr;
  };

  // A group's walk state and per-slot values, each entry one vector of the group's rows.
  struct Scratch {
    Buffer n;    // [2K, Dh] the running sums N
    Buffer e;    // [2K] forward: exp(m_{t-1} - m_t); backward: exp(m_t - m_{t+1})
    Buffer w;    // [2K] exp(a[t, j] - m_t) at a real slot, else 0
    Buffer p;    // [K] forward: the output's weights; backward: p_j m_j
    Buffer dp;   // [K] backward: g_t · aggv_t[j]
    Buffer ds;   // [K] backward: ds_j / sqrt(Dh)
    Buffer u;    // [2K, Dh] backward: the carries U
    Buffer c;    // [2, 2K] backward: the carried c, by the slot's parity
    Buffer agg;  // [C, 2K, Dh] backward: a chunk's aggregates
    Scratch(const Args<T>& a, bool backward)
        : n(2 * a.K * a.Dh), e(2 * a.K), w(2 * a.K), p(a.K), dp(backward ? a.K : 0), ds(backward ? a.K : 0),
          u(backward ? 2 * a.K * a.Dh : 0), c(backward ? 4 * a.K : 0), agg(backward ? a.C * 2 * a.K * a.Dh : 0) {}
  };

  // Slot t's keep factors of interest j: the dropout mask's, or ones.
  SEQREC_GROUP_FN V keep(const Args<T>& a, int64_t g, int64_t t, int64_t j) {
    return a.mask ? load(a.mask + ((g * a.L + t) * a.K + j) * R) : splat(T(1));
  }

  // Slot t's factors of every interest of both sides and the sums' step N_{t-1} -> N_t. With
  // `record` (the forward) m_t and Z_t are computed and written, else read.
  SEQREC_GROUP_FN void advance(const Args<T>& a, Scratch& sc, int64_t g, int64_t t, bool record) {
    const int64_t K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L;
    const V zero{};
    const M real = load(a.real + (g * L + t) * R) != zero;
    const T* at = a.a + (g * L + t) * K2 * R;
    T* mt = a.m + (g * L + t) * K2 * R;
    T* zt = a.z + (g * L + t) * K2 * R;
    for (int64_t j = 0; j < K2; ++j) {
      const V x = load(at + j * R);
      const V m_prev = t > 0 ? load(mt - K2 * R + j * R) : -inf();
      const V m_new = record ? ((real & (x > m_prev)) ? x : m_prev) : load(mt + j * R);
      const M had = m_prev != -inf(), seen = m_new != -inf();
      const V e = exp_nonpositive(had ? m_prev - m_new : zero);
      const V w = exp_nonpositive(real ? x - m_new : zero);
      const V e_j = had ? e : (seen ? zero : splat(T(1)));
      const V w_j = real ? w : zero;
      sc.e[j] = e_j;
      sc.w[j] = w_j;
      if (record) {
        store(mt + j * R, m_new);
        store(zt + j * R, seen ? (t > 0 ? load(zt - K2 * R + j * R) : zero) * e_j + w_j : zero);
      }
    }
    const T* kx = a.k + (g * L + t) * Dh * R;
    const T* vx = a.v + (g * L + t) * Dh * R;
    for (int64_t j = 0; j < K2; ++j) {
      const V e = sc.e[j], w = sc.w[j];
      const T* x = j < K ? kx : vx;
      V* nj = sc.n.data() + j * Dh;
      for (int64_t d = 0; d < Dh; ++d) nj[d] = nj[d] * e + w * load(x + d * R);
    }
  }

  // The softmax over the K scores s [K, R] of each row: its maximum and normaliser.
  SEQREC_GROUP_FN void softmax_of(const T* s, int64_t K, V& top, V& den) {
    top = -inf();
    for (int64_t j = 0; j < K; ++j) top = vmax(top, load(s + j * R));
    den = V{};
    for (int64_t j = 0; j < K; ++j) den += exp_nonpositive(load(s + j * R) - top);
  }

  // Forward of group g: every slot's output, m, Z and scores, and the checkpoints.
  SEQREC_GROUP_FN void forward(const Args<T>& a, int64_t g) {
    const int64_t K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L, chunks = a.chunks();
    Scratch sc(a, /*backward=*/false);
    for (int64_t t = 0; t < L; ++t) {
      if (a.ckpt && t % a.C == 0)
        std::memcpy(a.ckpt + (g * chunks + t / a.C) * K2 * Dh * R, sc.n.data(), sizeof(T) * K2 * Dh * R);
      advance(a, sc, g, t, /*record=*/true);
      const T* zt = a.z + (g * L + t) * K2 * R;
      const T* qt = a.q + (g * L + t) * Dh * R;
      T* st = a.s + (g * L + t) * K * R;
      for (int64_t j = 0; j < K; ++j)
        store(st + j * R, a.scale * dot(qt, sc.n.raw(j * Dh), Dh) / vmax(load(zt + j * R), tiny()));
      V top, den;
      softmax_of(st, K, top, den);
      for (int64_t j = 0; j < K; ++j)
        sc.p[j] = exp_nonpositive(load(st + j * R) - top) / den * keep(a, g, t, j) / vmax(load(zt + (K + j) * R), tiny());
      T* o = a.out + (g * L + t) * Dh * R;
      for (int64_t d = 0; d < Dh; ++d) {
        V acc{};
        for (int64_t j = 0; j < K; ++j) acc += sc.p[j] * sc.n[(K + j) * Dh + d];
        store(o + d * R, acc);
      }
    }
  }

  // Slot t of group g's reverse walk; agg_t [2K, Dh] is the chunk's recomputed row for t.
  SEQREC_GROUP_FN void backward_slot(const Args<T>& a, Scratch& sc, int64_t g, int64_t t, V* agg_t) {
    const int64_t K = a.K, K2 = 2 * K, Dh = a.Dh, L = a.L;
    const bool last = t + 1 >= L;
    const V zero{};
    const M real = load(a.real + (g * L + t) * R) != zero;
    const T* mt = a.m + (g * L + t) * K2 * R;
    const T* mn = last ? mt : mt + K2 * R;  // slot t + 1's (unused at the last slot)
    const T* zt = a.z + (g * L + t) * K2 * R;
    const T* qt = a.q + (g * L + t) * Dh * R;
    const T* gt = a.grad + (g * L + t) * Dh * R;
    const T* at = a.a + (g * L + t) * K2 * R;
    const T* st = a.s + (g * L + t) * K * R;
    const T* kt = a.k + (g * L + t) * Dh * R;
    const T* vt = a.v + (g * L + t) * Dh * R;
    const V* c_next = sc.c.data() + ((t + 1) & 1) * K2;  // zeros at the last slot
    V* c_here = sc.c.data() + (t & 1) * K2;
    T* gq = a.gq + (g * L + t) * Dh * R;
    T* gk = a.gk + (g * L + t) * Dh * R;
    T* gv = a.gv + (g * L + t) * Dh * R;
    T* ga = a.ga + (g * L + t) * K2 * R;
    const T* agg_raw = reinterpret_cast<const T*>(agg_t);

    for (int64_t j = 0; j < K; ++j) sc.dp[j] = dot(gt, agg_raw + (K + j) * Dh * R, Dh);
    for (int64_t j = 0; j < K2; ++j) {
      const V m = load(mt + j * R);
      const M carries = (m != -inf()) & (last ? M{} : ~M{});  // a seen interest, not at the last slot
      const V f = exp_nonpositive(carries ? m - load(mn + j * R) : zero);
      const V w = exp_nonpositive(real ? load(at + j * R) - m : zero);
      sc.e[j] = carries ? f : zero;
      sc.w[j] = real ? w : zero;
    }
    V top, den, sig{};
    softmax_of(st, K, top, den);
    for (int64_t j = 0; j < K; ++j) {
      const V p = exp_nonpositive(load(st + j * R) - top) / den;
      sc.p[j] = p * keep(a, g, t, j);
      sc.ds[j] = p;
      sig += sc.p[j] * sc.dp[j];
    }
    for (int64_t j = 0; j < K; ++j) sc.ds[j] = a.scale * sc.ds[j] * (keep(a, g, t, j) * sc.dp[j] - sig);
    for (int64_t d = 0; d < Dh; ++d) {  // one softmax term per interest, in interest order
      V acc{};
      for (int64_t j = 0; j < K; ++j) acc += sc.ds[j] * agg_t[j * Dh + d];
      store(gq + d * R, acc);
    }
    std::memset(gk, 0, sizeof(T) * Dh * R);
    std::memset(gv, 0, sizeof(T) * Dh * R);

    for (int64_t j = 0; j < K2; ++j) {
      V* u = sc.u.data() + j * Dh;
      const bool key = j < K;
      // G_t[j] = coef · (q_t or g_t).
      const V coef = key ? sc.ds[j] : sc.p[j - K];
      const T* src = key ? qt : gt;
      const T* x = key ? kt : vt;
      T* gx = key ? gk : gv;
      const V f = sc.e[j], w = sc.w[j];
      // A row with no real slot up to t has nothing before it to pass anything to: its U, c and
      // share of the logits' gradient are zeros (the row walk's early exit, as selects).
      const M seen = load(mt + j * R) != -inf();
      const V inv_z = seen ? splat(T(1)) / load(zt + j * R) : zero;  // Z_t >= 1 once seen
      const V c = seen ? coef * dot(src, agg_raw + j * Dh * R, Dh) * inv_z + f * c_next[j] : zero;
      const V cz = coef * inv_z;
      for (int64_t d = 0; d < Dh; ++d) u[d] = seen ? cz * load(src + d * R) + f * u[d] : zero;
      const M live = real & seen;
      const V wl = live ? w : zero;
      store(ga + j * R, live ? w * (dot(x, sc.u.raw(j * Dh), Dh) - c) : zero);
      c_here[j] = c;
      for (int64_t d = 0; d < Dh; ++d) store(gx + d * R, load(gx + d * R) + wl * u[d]);
    }
  }

  // Backward of group g: gq, the rows' dims of gk and gv, and their shares of ga.
  SEQREC_GROUP_FN void backward(const Args<T>& a, int64_t g) {
    const int64_t K2 = 2 * a.K, Dh = a.Dh, L = a.L, C = a.C, chunks = a.chunks();
    Scratch sc(a, /*backward=*/true);  // U and c start at zero
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t t0 = c * C, t1 = t0 + C < L ? t0 + C : L;
      std::memcpy(sc.n.data(), a.ckpt + (g * chunks + c) * K2 * Dh * R, sizeof(T) * K2 * Dh * R);
      for (int64_t t = t0; t < t1; ++t) {
        advance(a, sc, g, t, /*record=*/false);
        const T* zt = a.z + (g * L + t) * K2 * R;
        V* row = sc.agg.data() + (t - t0) * K2 * Dh;
        for (int64_t j = 0; j < K2; ++j) {
          const V inv = splat(T(1)) / vmax(load(zt + j * R), tiny());
          for (int64_t d = 0; d < Dh; ++d) row[j * Dh + d] = sc.n[j * Dh + d] * inv;
        }
      }
      for (int64_t t = t1 - 1; t >= t0; --t) backward_slot(a, sc, g, t, sc.agg.data() + (t - t0) * K2 * Dh);
    }
  }
};

#undef SEQREC_GROUP_FN

// Rows per group for T at the CPU level the functions below will run at, given the call's rows:
// one register, 32 bytes with AVX2 or AVX-512 (wider ones were slower: docs/benchmarks.md), 16 at
// the baseline, or 16 wherever that holds every row (a short batch would leave most of a wide
// group's lanes idle at the same cost per group).
template <typename T>
int64_t rows_per_group(int64_t rows) {
  const int64_t narrow = 16 / sizeof(T), wide = (cpu_has_avx2_fma() ? 32 : 16) / sizeof(T);
  return rows <= narrow ? narrow : wide;
}

// The group functions compiled once per CPU level and width, the walk inlined into each (the
// forward with backward = false). The vectors are passed between always-inline functions only,
// so GCC's note on the ABI of vectors wider than the baseline's registers concerns no call; the
// file compiling this passes -Wno-psabi.
template <typename T, int64_t R>
void run_group_base(const Args<T>& a, int64_t g, bool backward) {
  backward ? Group<T, R>::backward(a, g) : Group<T, R>::forward(a, g);
}
#if SEQREC_CPU_X86
template <typename T, int64_t R>
SEQREC_CPU_AVX2 void run_group_avx2(const Args<T>& a, int64_t g, bool backward) {
  backward ? Group<T, R>::backward(a, g) : Group<T, R>::forward(a, g);
}
template <typename T, int64_t R>
SEQREC_CPU_AVX512 void run_group_avx512(const Args<T>& a, int64_t g, bool backward) {
  backward ? Group<T, R>::backward(a, g) : Group<T, R>::forward(a, g);
}
#endif

// Group g's forward (backward = false) or backward at the CPU's level; a.R is
// rows_per_group<T>(rows).
template <typename T>
void run_group(const Args<T>& a, int64_t g, bool backward) {
  constexpr int64_t narrow = 16 / sizeof(T);
#if SEQREC_CPU_X86
  constexpr int64_t wide = 32 / sizeof(T);
  if (cpu_has_avx512())
    return a.R == narrow ? run_group_avx512<T, narrow>(a, g, backward) : run_group_avx512<T, wide>(a, g, backward);
  if (cpu_has_avx2_fma())
    return a.R == narrow ? run_group_avx2<T, narrow>(a, g, backward) : run_group_avx2<T, wide>(a, g, backward);
#endif
  run_group_base<T, narrow>(a, g, backward);
}

}  // namespace seqrec::ops::interest_groups
