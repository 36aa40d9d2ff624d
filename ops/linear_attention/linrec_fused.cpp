// LinRec's global form with the paper's normalisation, fused on the CPU: the whole of
// linrec_attention(..., kPaper, kGlobal), ELU included, in two passes over each sequence
// forward and two backward, with a hand-written backward. Each pass walks the sequence's slots
// once and, at each slot, all its heads (threads take whole sequences).
//
// Per sequence, qe = elu(q), ke = elu(k) at the n real slots (padded keys take no part):
//     c[i] = sum_s ke[s, i]²                   s[i] = 1 / sqrt(max(c[i], eps) · max(n, 1))
//     S    = sum_s ke[s] vᵀ[s]   [D x E]       r[t] = max(||qe[t]||, eps)
//     w[t, i] = qe[t, i] · s[i] / (r[t] · sqrt(D))     out[t] = w[t]ᵀ S
// Backward, given gout:
//     gw[t] = S gout[t]            G  = sum_t w[t] goutᵀ[t]          ds[i] = sum_t gw[t, i] · u[t, i]
//     gu[t] = gw[t] ⊙ s            gqe[t] = (gu[t] - qe[t] (qe[t]·gu[t]) / r²) / (r · sqrt(D))
//     dc[i] = -½ ds[i] s[i]³ max(n, 1)   (0 where c[i] < eps, as clamp_min passes no gradient)
//     gke[s] = G v[s] + 2 dc ⊙ ke[s],   gv[s] = Gᵀ ke[s]   (real slots; 0 at padded ones)
// then through ELU (elu'(x) = 1 for x > 0, elu(x) + 1 below), with u[t] = qe[t] / (r[t] · sqrt(D));
// where ||qe[t]|| < eps the norm is the constant eps. Every product is a row update (a sum of
// rows of S, Sᵀ, G or Gᵀ), so the widths are the vector loops and no horizontal sums run per
// element; ELU's exp is a branch-free polynomial in float (so that it vectorises too) and
// std::exp in double. The widths LinRec's configs use (16: d 128 in 8 heads; 50: d 50 in one)
// are compile-time constants; others take the generic loops. What it replaces, ten elementwise
// ATen passes forward and twenty backward around the product, cost more than the product itself
// (docs/benchmarks.md).
//
// Pad keys (LinrecPadKeys: count[b] copies of one key and value per sequence) are one more term
// of c, of S and of n in the forward; backward, the key's gradient is count · (G v + 2 dc ⊙ ke)
// through ELU and the value's count · Gᵀ ke, per sequence, summed over the sequences in order.
//
// Three entries share the kernels: q, k, v as separate [B, H, L, Dh] tensors (strided along B, H
// and L; output laid out [B, L, H, Dv], returned as its [B, H, L, Dv] view); the packed
// projection [B, L, 3·D] the model computes (output [B, L, D], gradient [B, L, 3·D]: splitting
// and merging the heads costs nothing either way); and the last slot alone, its query [B, D]
// against the packed keys and values [B, L, 2·D] (the query pass then walks one row).
#include "ops/linear_attention/linear_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/bf16_bits.h"
#include "ops/cpu_features.h"
#include "ops/exp_nonpositive.h"
#include "ops/linear_attention/row_sums.h"

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kEps = 1e-12;  // the reference's guard for all-zero rows and key columns

// A [B, H, L, W] tensor with unit stride along W: sequence (b, h) starts at p + b·sb + h·sh,
// its rows st apart.
template <typename T>
struct View {
  T* p;
  int64_t sb, sh, st;
  T* seq(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
};
template <typename T>
View<T> view_of(const at::Tensor& t) {
  using Plain = std::remove_const_t<T>;
  return {t.data_ptr<Plain>(), t.stride(0), t.stride(1), t.stride(2)};
}

template <typename T>
struct Args {
  View<const T> q, k, v;  // before ELU; q holds Lq rows, k and v L
  const bool* pad;  // [B, L], true at padded slots
  int64_t B, H, L, D, E;
  int64_t Lq;  // the queries (L, or 1 for the last slot alone): the global form lets each see every key
  // Pad keys, or null: the key [H x D] before ELU, the value [H x E], each sequence's count [B].
  const T* pad_key = nullptr;
  const T* pad_value = nullptr;
  const int64_t* pad_count = nullptr;
  int64_t pad_keys(int64_t b) const { return pad_count ? pad_count[b] : 0; }
};

// Where the backward writes each sequence's gradients of the pad key [B x H x D] and value
// [B x H x E] (null: no pad keys).
template <typename T>
struct PadGrads {
  T* key = nullptr;
  T* value = nullptr;
};

// Scratch per thread for one sequence's H heads, the larger of the two passes' needs: forward
// 1 + kGroup rows of D per head; backward Sᵀ, G and Gᵀ, and 3 + 4·kGroup rows of D, per head; and
// up to three values per head (a slot's query norms).
inline int64_t scratch_elements(int64_t H, int64_t D, int64_t E) { return H * (3 * D * E + 19 * D + 3) + D; }

template <typename T>
__attribute__((always_inline)) inline T inv_clamped_norm(T r) {
  return T(1) / (r < T(kEps) ? T(kEps) : r);  // std::max's result, in a form the heads' loop vectorises
}

// The keys' column scales s[i] = 1 / sqrt(max(c[i], eps) · n') from their sums of squares c and
// n' = max(real keys, 1): the forward's and the backward's, one formula.
template <typename T>
__attribute__((always_inline)) inline void column_scales(const T* __restrict__ c, T nn, int64_t D,
                                                         T* __restrict__ s) {
  for (int64_t i = 0; i < D; ++i) s[i] = T(1) / std::sqrt(std::max(c[i], T(kEps)) * nn);
}

// e[i] = elu(x[i]) over one row of width D.
template <typename T>
__attribute__((always_inline)) inline void elu_row(const T* __restrict__ x, T* __restrict__ e, int64_t D) {
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) {
    const T xi = x[i];
    const T neg = exp_nonpositive(xi < T(0) ? xi : T(0)) - T(1);  // both sides, then a select
    e[i] = xi > T(0) ? xi : neg;
  }
}

// A slot's query rows after ELU, one per head (e[h] = row h), each into its head's row of `rows`
// and its squared norm into r2[h]: the heads' square roots and divisions then run as one vector
// loop, not one scalar chain per head.
template <typename T>
__attribute__((always_inline)) inline void elu_heads(View<const T> q, int64_t b, int64_t t, int64_t H, int64_t D,
                                                     T* const* e, T* __restrict__ r2) {
  for (int64_t h = 0; h < H; ++h) {
    T* __restrict__ eh = e[h];
    elu_row(q.seq(b, h) + t * q.st, eh, D);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < D; ++i) sum += eh[i] * eh[i];
    r2[h] = sum;
  }
}

// The row of every head kAhead slots ahead of slot t, asked for before slot t is worked on: a
// sequence's rows sit a whole projection row apart, and the passes stalled on loading them.
constexpr int64_t kAhead = 4;
template <typename T>
__attribute__((always_inline)) inline void prefetch_heads(View<const T> x, int64_t b, int64_t H, int64_t W,
                                                          int64_t t, int64_t n) {
  if (t + kAhead >= n) return;
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t h = 0; h < H; ++h) {
    const T* row = x.seq(b, h) + (t + kAhead) * x.st;
    for (int64_t i = 0; i < W; i += kLine) __builtin_prefetch(row + i, 0, 3);
  }
}

// Rows are taken in groups of four (kGroup): a product with S, Sᵀ, G or Gᵀ then reads each of
// its rows once for four slots, and a rank-1 update of S or G loads and stores each row once for
// four (weighted_rows4, add_outer4); a group's last rows, when fewer, go one by one.
constexpr int kGroup = 4;

// The keys' pass of the forward over one group of cnt real keys (ELU applied): their squares
// into c, their outer products with the values into S.
template <typename T, int kE>
__attribute__((always_inline)) inline void forward_keys(const T* const* ke, const T* const* vt, int cnt, int64_t D,
                                                        int64_t E, T* __restrict__ S, T* __restrict__ c) {
  for (int r = 0; r < cnt; ++r) {
    const T* __restrict__ kr = ke[r];
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) c[i] += kr[i] * kr[i];
  }
  if (cnt == kGroup) return add_outer4<T, kE>(S, ke, vt, D, E);
  for (int r = 0; r < cnt; ++r) add_outer<T, kE>(S, ke[r], vt[r], D, E);
}

// The pad keys' share of the forward for one head: `count` copies of key k (before ELU) and value
// v, one term of c and one rank-1 term of S. buf: scratch [D].
template <typename T, int kE>
__attribute__((always_inline)) inline void forward_pad_keys(const T* __restrict__ k, const T* __restrict__ v,
                                                            T count, int64_t D, int64_t E, T* __restrict__ buf,
                                                            T* __restrict__ S, T* __restrict__ c) {
  elu_row(k, buf, D);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) {
    c[i] += count * buf[i] * buf[i];
    buf[i] *= count;
  }
  add_outer<T, kE>(S, buf, v, D, E);
}

// Forward of sequence b, all H heads together: each pass walks the slots once and, at each slot,
// every head, so that a packed projection's rows are read in order (a head's rows alone sit a
// whole row apart, a stride the hardware prefetchers do not follow). S [H x D x E] and c [H x D]
// are what the backward reuses; each head's S stays in L1 (1 KiB at width 16).
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void forward_seq(const Args<T>& a, int64_t b, View<T> out, T* S, T* c,
                                                       T* scratch, const T** ptrs, T** outs) {
  const int64_t D = kD > 0 ? kD : a.D, E = kE > 0 ? kE : a.E, L = a.L, H = a.H;
  const bool* pad = a.pad + b * L;
  T* __restrict__ s = scratch;         // [H x D]
  T* __restrict__ rows = s + H * D;    // [H x kGroup x D]: keys after ELU, then the queries' w
  const T** ke = ptrs;                 // [H x kGroup]
  const T** vt = ptrs + H * kGroup;    // [H x kGroup]
  std::fill(S, S + H * D * E, T(0));
  std::fill(c, c + H * D, T(0));
  int64_t n = 0;
  int g = 0;
  for (int64_t t = 0; t < L; ++t) {
    prefetch_heads(a.k, b, H, D, t, L);
    prefetch_heads(a.v, b, H, E, t, L);
    if (pad[t]) continue;
    ++n;
    for (int64_t h = 0; h < H; ++h) {
      T* eh = rows + (h * kGroup + g) * D;
      elu_row(a.k.seq(b, h) + t * a.k.st, eh, D);
      ke[h * kGroup + g] = eh;
      vt[h * kGroup + g] = a.v.seq(b, h) + t * a.v.st;
    }
    if (++g == kGroup) {
      for (int64_t h = 0; h < H; ++h)
        forward_keys<T, kE>(ke + h * kGroup, vt + h * kGroup, g, D, E, S + h * D * E, c + h * D);
      g = 0;
    }
  }
  for (int64_t h = 0; h < H; ++h)
    forward_keys<T, kE>(ke + h * kGroup, vt + h * kGroup, g, D, E, S + h * D * E, c + h * D);
  if (const int64_t np = a.pad_keys(b); np > 0) {
    for (int64_t h = 0; h < H; ++h)
      forward_pad_keys<T, kE>(a.pad_key + h * D, a.pad_value + h * E, static_cast<T>(np), D, E, rows,
                              S + h * D * E, c + h * D);
    n += np;
  }

  const T nn = static_cast<T>(std::max<int64_t>(n, 1)), inv_sqrt_d = T(1) / std::sqrt(static_cast<T>(D));
  for (int64_t h = 0; h < H; ++h) column_scales(c + h * D, nn, D, s + h * D);
  const T** ws = ptrs;  // [H x kGroup], the keys' pointers no longer needed
  T* __restrict__ r2 = rows + H * kGroup * D;  // [H]: the slot's squared query norms, then its scales
  T** es = outs + H * kGroup;                  // [H]: where each head's query row goes
  g = 0;
  for (int64_t t = 0; t < a.Lq; ++t) {
    prefetch_heads(a.q, b, H, D, t, a.Lq);
    for (int64_t h = 0; h < H; ++h) es[h] = rows + (h * kGroup + g) * D;
    elu_heads(a.q, b, t, H, D, es, r2);
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) r2[h] = inv_clamped_norm(std::sqrt(r2[h])) * inv_sqrt_d;
    for (int64_t h = 0; h < H; ++h) {
      const T* __restrict__ sh = s + h * D;
      const T scale = r2[h];
      T* __restrict__ w = es[h];  // the query after ELU, scaled in place
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) w[i] = w[i] * scale * sh[i];
      ws[h * kGroup + g] = w;
      outs[h * kGroup + g] = out.seq(b, h) + t * out.st;
    }
    if (++g == kGroup) {
      for (int64_t h = 0; h < H; ++h) weighted_rows4<T, kE>(ws + h * kGroup, S + h * D * E, D, E, outs + h * kGroup);
      g = 0;
    }
  }
  for (int64_t h = 0; h < H; ++h)
    for (int r = 0; r < g; ++r)
      weighted_rows<T, kE>(ws[h * kGroup + r], S + h * D * E, D, E, outs[h * kGroup + r]);
}

template <typename T>
__attribute__((always_inline)) inline void transpose(const T* __restrict__ from, T* __restrict__ to, int64_t rows,
                                                     int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) to[j * rows + i] = from[i * cols + j];
}

// One query row of the backward, kept while its group fills.
template <typename T>
struct QueryRow {
  const T* raw;  // before ELU
  const T* e;    // after ELU
  const T* u;    // e / (r · sqrt(D))
  const T* w;    // u ⊙ s
  const T* g;    // its output's gradient
  T* gw;         // S g, then the gradient of u
  T* gq;         // its gradient
  T r, inv_r, scale;
};

// The queries' pass of the backward over one group of cnt rows: gw = S g (a sum of rows of Sᵀ),
// G += w gᵀ, then each row's ds and gradient through the row norm and ELU.
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void backward_queries(QueryRow<T>* rows, int cnt, int64_t D, int64_t E,
                                                            const T* __restrict__ ST, const T* __restrict__ s,
                                                            T* __restrict__ G, T* __restrict__ ds) {
  if (cnt == kGroup) {
    const T* gs[kGroup] = {rows[0].g, rows[1].g, rows[2].g, rows[3].g};
    const T* ws[kGroup] = {rows[0].w, rows[1].w, rows[2].w, rows[3].w};
    T* gws[kGroup] = {rows[0].gw, rows[1].gw, rows[2].gw, rows[3].gw};
    weighted_rows4<T, kD>(gs, ST, E, D, gws);
    add_outer4<T, kE>(G, ws, gs, D, E);
  } else {
    for (int r = 0; r < cnt; ++r) {
      weighted_rows<T, kD>(rows[r].g, ST, E, D, rows[r].gw);
      add_outer<T, kE>(G, rows[r].w, rows[r].g, D, E);
    }
  }
  for (int r = 0; r < cnt; ++r) {
    const QueryRow<T>& x = rows[r];
    const T* __restrict__ qt = x.e;
    const T* __restrict__ u = x.u;
    const T* __restrict__ qraw = x.raw;
    T* __restrict__ gw = x.gw;
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < D; ++i) {
      ds[i] += gw[i] * u[i];
      gw[i] *= s[i];  // now the gradient of u
      dot += qt[i] * gw[i];
    }
    // Below eps the norm is a constant: no gradient through it.
    const T along = x.r >= T(kEps) ? dot * x.inv_r * x.inv_r : T(0);
    T* __restrict__ gqt = x.gq;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i)
      gqt[i] = x.scale * (gw[i] - qt[i] * along) * (qraw[i] > T(0) ? T(1) : qt[i] + T(1));
  }
}

// The keys' pass of the backward over one group of cnt real keys (ELU applied in ke): the keys'
// gradient before ELU, G v less the norm's term (a sum of rows of Gᵀ), and the values' Gᵀ ke.
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void backward_keys(const T* const* kraw, const T* const* ke, const T* const* vt,
                                                         T* const* gk, T* const* gv, T* const* gw, int cnt, int64_t D,
                                                         int64_t E, const T* __restrict__ G, const T* __restrict__ GT,
                                                         const T* __restrict__ dc) {
  if (cnt == kGroup) weighted_rows4<T, kD>(vt, GT, E, D, gw);
  else
    for (int r = 0; r < cnt; ++r) weighted_rows<T, kD>(vt[r], GT, E, D, gw[r]);
  for (int r = 0; r < cnt; ++r) {
    const T* __restrict__ kt = ke[r];
    const T* __restrict__ kr = kraw[r];
    const T* __restrict__ gwr = gw[r];
    T* __restrict__ gkt = gk[r];
#pragma omp simd
    for (int64_t i = 0; i < D; ++i)
      gkt[i] = (gwr[i] + T(2) * dc[i] * kt[i]) * (kr[i] > T(0) ? T(1) : kt[i] + T(1));
  }
  if (cnt == kGroup) weighted_rows4<T, kE>(ke, G, D, E, gv);
  else
    for (int r = 0; r < cnt; ++r) weighted_rows<T, kE>(ke[r], G, D, E, gv[r]);
}

// The pad keys' share of the backward for one head: `count` copies of key k (before ELU) and
// value v give gk = count · (G v + 2 dc ⊙ elu(k)) through ELU and gv = count · Gᵀ elu(k).
// buf: scratch [2·D].
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void backward_pad_keys(const T* __restrict__ k, const T* __restrict__ v,
                                                             T count, int64_t D, int64_t E, const T* __restrict__ G,
                                                             const T* __restrict__ GT, const T* __restrict__ dc,
                                                             T* __restrict__ buf, T* __restrict__ gk,
                                                             T* __restrict__ gv) {
  T* __restrict__ e = buf;
  T* __restrict__ gw = buf + D;
  elu_row(k, e, D);
  weighted_rows<T, kD>(v, GT, E, D, gw);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) gk[i] = count * (gw[i] + T(2) * dc[i] * e[i]) * (k[i] > T(0) ? T(1) : e[i] + T(1));
  weighted_rows<T, kE>(e, G, D, E, gv);
#pragma omp simd
  for (int64_t j = 0; j < E; ++j) gv[j] *= count;
}

// Backward of sequence b, all heads together (as forward_seq walks them).
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void backward_seq(const Args<T>& a, int64_t b, View<const T> g,
                                                        const T* __restrict__ S, const T* __restrict__ c, View<T> gq,
                                                        View<T> gk, View<T> gv, PadGrads<T> gpad, T* scratch,
                                                        const T** cptrs, T** mptrs, QueryRow<T>* qrows) {
  const int64_t D = kD > 0 ? kD : a.D, E = kE > 0 ? kE : a.E, L = a.L, H = a.H, DE = D * E;
  const bool* pad = a.pad + b * L;
  T* __restrict__ ST = scratch;            // [H x E x D]
  T* __restrict__ G = ST + H * DE;         // [H x D x E]
  T* __restrict__ GT = G + H * DE;         // [H x E x D]
  T* __restrict__ s = GT + H * DE;         // [H x D]
  T* __restrict__ ds = s + H * D;          // [H x D]
  T* __restrict__ dc = ds + H * D;         // [H x D]
  T* __restrict__ rows = dc + H * D;       // [H x kGroup] x (e, u, w, gw), each [D]
  const int64_t np = a.pad_keys(b);
  int64_t n = np;
  for (int64_t t = 0; t < L; ++t) n += pad[t] ? 0 : 1;
  const T nn = static_cast<T>(std::max<int64_t>(n, 1)), inv_sqrt_d = T(1) / std::sqrt(static_cast<T>(D));
  for (int64_t h = 0; h < H; ++h) {
    column_scales(c + h * D, nn, D, s + h * D);
    transpose(S + h * DE, ST + h * DE, D, E);
  }
  std::fill(G, G + H * DE, T(0));
  std::fill(ds, ds + H * D, T(0));

  // Queries: gw = S gout[t]; G and ds accumulate; gqe through the row norm.
  int cnt = 0;
  T* __restrict__ r2 = rows + 4 * H * kGroup * D;  // [H]: the slot's squared query norms, then the norms
  T* __restrict__ inv_r = r2 + H;                   // [H]
  T* __restrict__ scales = inv_r + H;               // [H]
  for (int64_t t = 0; t < a.Lq; ++t) {
    prefetch_heads(a.q, b, H, D, t, a.Lq);
    prefetch_heads(g, b, H, E, t, a.Lq);
    T** es = mptrs;  // [H], free until the keys' pass
    for (int64_t h = 0; h < H; ++h) es[h] = rows + 4 * (h * kGroup + cnt) * D;
    elu_heads(a.q, b, t, H, D, es, r2);
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) {
      r2[h] = std::sqrt(r2[h]);
      inv_r[h] = inv_clamped_norm(r2[h]);
      scales[h] = inv_r[h] * inv_sqrt_d;
    }
    for (int64_t h = 0; h < H; ++h) {
      const T* __restrict__ sh = s + h * D;
      T* e = es[h];
      T* u = e + D;
      T* w = u + D;
      QueryRow<T>& x = qrows[h * kGroup + cnt];
      x.raw = a.q.seq(b, h) + t * a.q.st;
      x.r = r2[h];
      x.inv_r = inv_r[h];
      x.scale = scales[h];
      const T scale = x.scale;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) {
        u[i] = e[i] * scale;
        w[i] = u[i] * sh[i];
      }
      x.e = e;
      x.u = u;
      x.w = w;
      x.gw = w + D;
      x.g = g.seq(b, h) + t * g.st;
      x.gq = gq.seq(b, h) + t * gq.st;
    }
    if (++cnt == kGroup) {
      for (int64_t h = 0; h < H; ++h)
        backward_queries<T, kD, kE>(qrows + h * kGroup, cnt, D, E, ST + h * DE, s + h * D, G + h * DE, ds + h * D);
      cnt = 0;
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    backward_queries<T, kD, kE>(qrows + h * kGroup, cnt, D, E, ST + h * DE, s + h * D, G + h * DE, ds + h * D);
    const T *__restrict__ ch = c + h * D, *__restrict__ sh = s + h * D, *__restrict__ dsh = ds + h * D;
    T* __restrict__ dch = dc + h * D;
    for (int64_t i = 0; i < D; ++i)
      dch[i] = ch[i] >= T(kEps) ? T(-0.5) * dsh[i] * sh[i] * sh[i] * sh[i] * nn : T(0);
    transpose(G + h * DE, GT + h * DE, D, E);
  }

  // Keys and values, real slots only.
  const int64_t HG = H * kGroup;
  const T** kraw = cptrs;
  const T** ke = cptrs + HG;
  const T** vt = cptrs + 2 * HG;
  T** gkt = mptrs;
  T** gvt = mptrs + HG;
  T** gw = mptrs + 2 * HG;
  cnt = 0;
  for (int64_t t = 0; t < L; ++t) {
    prefetch_heads(a.k, b, H, D, t, L);
    prefetch_heads(a.v, b, H, E, t, L);
    if (pad[t]) {
      for (int64_t h = 0; h < H; ++h) {
        T* gkr = gk.seq(b, h) + t * gk.st;
        T* gvr = gv.seq(b, h) + t * gv.st;
        std::fill(gkr, gkr + D, T(0));
        std::fill(gvr, gvr + E, T(0));
      }
      continue;
    }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t j = h * kGroup + cnt;
      T* e = rows + 2 * j * D;
      kraw[j] = a.k.seq(b, h) + t * a.k.st;
      elu_row(kraw[j], e, D);
      ke[j] = e;
      gw[j] = e + D;  // the keys' gradient after ELU, less the norm's term
      vt[j] = a.v.seq(b, h) + t * a.v.st;
      gkt[j] = gk.seq(b, h) + t * gk.st;
      gvt[j] = gv.seq(b, h) + t * gv.st;
    }
    if (++cnt == kGroup) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t j = h * kGroup;
        backward_keys<T, kD, kE>(kraw + j, ke + j, vt + j, gkt + j, gvt + j, gw + j, cnt, D, E, G + h * DE,
                                 GT + h * DE, dc + h * D);
      }
      cnt = 0;
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    const int64_t j = h * kGroup;
    backward_keys<T, kD, kE>(kraw + j, ke + j, vt + j, gkt + j, gvt + j, gw + j, cnt, D, E, G + h * DE, GT + h * DE,
                             dc + h * D);
  }
  if (!gpad.key) return;
  T* gpk = gpad.key + b * H * D;
  T* gpv = gpad.value + b * H * E;
  if (np == 0) {
    std::fill(gpk, gpk + H * D, T(0));
    std::fill(gpv, gpv + H * E, T(0));
    return;
  }
  for (int64_t h = 0; h < H; ++h)
    backward_pad_keys<T, kD, kE>(a.pad_key + h * D, a.pad_value + h * E, static_cast<T>(np), D, E, G + h * DE,
                                 GT + h * DE, dc + h * D, rows, gpk + h * D, gpv + h * E);
}

// Sequences [begin, end) of B, each with all its heads, for one width specialisation; compiled
// once for the baseline, once for AVX2 + FMA and, at width 16 (a row is one 512-bit register),
// once for AVX-512.
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void forward_range_any(const Args<T>& a, View<T> out, T* S, T* c, int64_t begin,
                                                             int64_t end) {
  std::vector<T> scratch(scratch_elements(a.H, a.D, a.E));
  std::vector<const T*> ptrs(2 * a.H * kGroup);
  std::vector<T*> outs(a.H * (kGroup + 1));
  for (int64_t b = begin; b < end; ++b)
    forward_seq<T, kD, kE>(a, b, out, S + b * a.H * a.D * a.E, c + b * a.H * a.D, scratch.data(), ptrs.data(),
                           outs.data());
}
template <typename T, int kD, int kE>
__attribute__((always_inline)) inline void backward_range_any(const Args<T>& a, View<const T> g, const T* S,
                                                              const T* c, View<T> gq, View<T> gk, View<T> gv,
                                                              PadGrads<T> gpad, int64_t begin, int64_t end) {
  std::vector<T> scratch(scratch_elements(a.H, a.D, a.E));
  std::vector<const T*> cptrs(3 * a.H * kGroup);
  std::vector<T*> mptrs(3 * a.H * kGroup);
  std::vector<QueryRow<T>> qrows(a.H * kGroup);
  for (int64_t b = begin; b < end; ++b)
    backward_seq<T, kD, kE>(a, b, g, S + b * a.H * a.D * a.E, c + b * a.H * a.D, gq, gk, gv, gpad, scratch.data(),
                            cptrs.data(), mptrs.data(), qrows.data());
}

template <typename T, int kD, int kE>
void forward_range(const Args<T>& a, View<T> out, T* S, T* c, int64_t begin, int64_t end) {
  forward_range_any<T, kD, kE>(a, out, S, c, begin, end);
}
template <typename T, int kD, int kE>
void backward_range(const Args<T>& a, View<const T> g, const T* S, const T* c, View<T> gq, View<T> gk, View<T> gv,
                    PadGrads<T> gpad, int64_t begin, int64_t end) {
  backward_range_any<T, kD, kE>(a, g, S, c, gq, gk, gv, gpad, begin, end);
}
#if SEQREC_CPU_X86
template <typename T, int kD, int kE>
SEQREC_CPU_AVX2 void forward_range_avx2(const Args<T>& a, View<T> out, T* S, T* c, int64_t begin, int64_t end) {
  forward_range_any<T, kD, kE>(a, out, S, c, begin, end);
}
template <typename T, int kD, int kE>
SEQREC_CPU_AVX2 void backward_range_avx2(const Args<T>& a, View<const T> g, const T* S, const T* c, View<T> gq,
                                         View<T> gk, View<T> gv, PadGrads<T> gpad, int64_t begin, int64_t end) {
  backward_range_any<T, kD, kE>(a, g, S, c, gq, gk, gv, gpad, begin, end);
}
template <typename T, int kD, int kE>
SEQREC_CPU_AVX512 void forward_range_avx512(const Args<T>& a, View<T> out, T* S, T* c, int64_t begin, int64_t end) {
  forward_range_any<T, kD, kE>(a, out, S, c, begin, end);
}
template <typename T, int kD, int kE>
SEQREC_CPU_AVX512 void backward_range_avx512(const Args<T>& a, View<const T> g, const T* S, const T* c, View<T> gq,
                                             View<T> gk, View<T> gv, PadGrads<T> gpad, int64_t begin,
                                             int64_t end) {
  backward_range_any<T, kD, kE>(a, g, S, c, gq, gk, gv, gpad, begin, end);
}
#endif

// Calls f(std::integral_constant<int, W>{}) with the compile-time width for D = E = W when one
// is specialised, else with 0 (the generic loops).
template <typename F>
void with_width(int64_t D, int64_t E, F&& f) {
  if (D == E) {
    if (D == 16) return f(std::integral_constant<int, 16>{});
    if (D == 50) return f(std::integral_constant<int, 50>{});
    if (D == 64) return f(std::integral_constant<int, 64>{});
  }
  f(std::integral_constant<int, 0>{});
}

// A [B, H, L, W] tensor laid out [B, L, H, W] (the model's head layout), seen as [B, H, L, W].
at::Tensor empty_heads(int64_t B, int64_t H, int64_t L, int64_t W, const at::TensorOptions& options) {
  return torch::empty({B, L, H, W}, options).permute({0, 2, 1, 3});
}

// Unit stride along the last dimension, as the kernels read rows.
at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// Heads h of a [B, L, H·W] tensor (at column offset col) seen as [B, H, L, W]; a [B, H·W] one
// (one slot) as [B, H, 1, W].
at::Tensor heads_of(const at::Tensor& packed, int64_t H, int64_t W, int64_t col) {
  const int64_t B = packed.size(0);
  if (packed.dim() == 2) return packed.as_strided({B, H, 1, W}, {packed.stride(0), W, H * W, 1}, packed.storage_offset() + col);
  const int64_t L = packed.size(1);
  return packed.as_strided({B, H, L, W}, {packed.stride(0), W, packed.stride(1), 1}, packed.storage_offset() + col);
}

// Pad keys as the kernels read them: key [H, D], value [H, E] and count [B], contiguous
// (undefined: none).
struct PadTensors {
  at::Tensor key, value, count;
  PadTensors() = default;
  PadTensors(const at::Tensor& k, const at::Tensor& v, const at::Tensor& n) {
    if (!n.defined() || k.dim() != 2) return;  // none (Padded's stand-ins)
    key = k.contiguous();
    value = v.contiguous();
    count = n.contiguous();
  }
  template <typename T>
  void set(Args<T>& a) const {
    if (!count.defined()) return;
    a.pad_key = key.data_ptr<T>();
    a.pad_value = value.data_ptr<T>();
    a.pad_count = count.data_ptr<int64_t>();
  }
};

// Each sequence's pad-key gradients as the backward writes them ([B, H, D] and [B, H, E]), and
// their sums over the sequences, added in order in double (the same at any thread count).
struct PadGradTensors {
  at::Tensor key, value;  // per sequence
  PadGradTensors(const PadTensors& p, int64_t B) {
    if (!p.count.defined()) return;
    key = torch::empty({B, p.key.size(0), p.key.size(1)}, p.key.options());
    value = torch::empty({B, p.value.size(0), p.value.size(1)}, p.value.options());
  }
  template <typename T>
  PadGrads<T> grads() const {
    return key.defined() ? PadGrads<T>{key.data_ptr<T>(), value.data_ptr<T>()} : PadGrads<T>{};
  }
  static at::Tensor summed(const at::Tensor& per_sequence) {
    if (!per_sequence.defined()) return {};
    const int64_t B = per_sequence.size(0);
    int64_t N = 1;
    for (int64_t d = 1; d < per_sequence.dim(); ++d) N *= per_sequence.size(d);
    auto d = per_sequence.to(at::kDouble).reshape({B, N});
    std::vector<double> total(N, 0.0);
    const double* p = d.data_ptr<double>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i) total[i] += p[b * N + i];
    auto out = torch::empty({N}, at::kDouble);
    std::copy(total.begin(), total.end(), out.data_ptr<double>());
    return out.to(per_sequence.scalar_type()).view(per_sequence.sizes().slice(1));
  }
  at::Tensor key_sum() const { return summed(key); }
  at::Tensor value_sum() const { return summed(value); }
};

// Both passes of either direction over all B·H sequences. k, v, gk, gv: [B, H, L, *]; q, out, g, gq:
// [B, H, Lq, *]; all with unit stride along the last dimension; S [B, H, D, E] and c [B, H, D]
// contiguous.
void launch_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
                    const PadTensors& pad_keys, const at::Tensor& out, const at::Tensor& S, const at::Tensor& c) {
  const int64_t B = q.size(0), H = q.size(1), L = k.size(2), D = q.size(3), E = v.size(3);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linrec_global_paper_fused", [&] {
    using T = scalar_t;
    Args<T> a{view_of<const T>(q), view_of<const T>(k), view_of<const T>(v), pad.data_ptr<bool>(), B, H, L, D, E,
              q.size(2)};
    pad_keys.set(a);
    const View<T> o = view_of<T>(out);
    T *Sp = S.data_ptr<T>(), *cp = c.data_ptr<T>();
    with_width(D, E, [&](auto width) {
      constexpr int W = decltype(width)::value;
      at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
#if SEQREC_CPU_X86
        if constexpr (W == 16)
          if (cpu_has_avx512()) return forward_range_avx512<T, W, W>(a, o, Sp, cp, begin, end);
        if (cpu_has_avx2_fma()) return forward_range_avx2<T, W, W>(a, o, Sp, cp, begin, end);
#endif
        forward_range<T, W, W>(a, o, Sp, cp, begin, end);
      });
    });
  });
}

// Returns the pad keys' gradients, summed over the sequences (undefined without pad keys).
std::pair<at::Tensor, at::Tensor> launch_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& pad, const PadTensors& pad_keys,
                                                  const at::Tensor& S, const at::Tensor& c, const at::Tensor& g,
                                                  const at::Tensor& gq, const at::Tensor& gk, const at::Tensor& gv) {
  const int64_t B = q.size(0), H = q.size(1), L = k.size(2), D = q.size(3), E = v.size(3);
  const PadGradTensors gpad(pad_keys, B);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linrec_global_paper_fused_backward", [&] {
    using T = scalar_t;
    Args<T> a{view_of<const T>(q), view_of<const T>(k), view_of<const T>(v), pad.data_ptr<bool>(), B, H, L, D, E,
              q.size(2)};
    pad_keys.set(a);
    const View<const T> gout = view_of<const T>(g);
    const View<T> gqv = view_of<T>(gq), gkv = view_of<T>(gk), gvv = view_of<T>(gv);
    const PadGrads<T> gp = gpad.grads<T>();
    const T *Sp = S.data_ptr<T>(), *cp = c.data_ptr<T>();
    with_width(D, E, [&](auto width) {
      constexpr int W = decltype(width)::value;
      at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
#if SEQREC_CPU_X86
        if constexpr (W == 16)
          if (cpu_has_avx512()) return backward_range_avx512<T, W, W>(a, gout, Sp, cp, gqv, gkv, gvv, gp, begin, end);
        if (cpu_has_avx2_fma()) return backward_range_avx2<T, W, W>(a, gout, Sp, cp, gqv, gkv, gvv, gp, begin, end);
#endif
        backward_range<T, W, W>(a, gout, Sp, cp, gqv, gkv, gvv, gp, begin, end);
      });
    });
  });
  return {gpad.key_sum(), gpad.value_sum()};
}

// The bfloat16 entries (`--matmul_precision medium`): the queries' projection and the keys' and
// values' arrive as bfloat16 products (ops::product_bf16) with their float32 biases, and the
// output leaves in bfloat16 for the output projection's product. Each sequence's rows are widened
// and biased into per-thread float blocks as its pass starts, the float kernels above run on those
// blocks, and what the pass writes is rounded to bfloat16 as it leaves them, so only the bfloat16
// tensors cross memory. The values are the composition's bit for bit (product.to(float) + bias,
// the float op, its result rounded); the biases' gradients are each sequence's sums in float,
// added in order in double (so the same for any thread count).

// A [B, R, W] bfloat16 tensor's rows, unit stride along W: sequence b's row t at p + b·sb + t·st.
template <typename P>
struct Bf16Rows {
  P* p;
  int64_t sb, st;
  P* row(int64_t b, int64_t t) const { return p + b * sb + t * st; }
};
template <typename P>
Bf16Rows<P> bf16_rows(const at::Tensor& t) {
  auto* base = reinterpret_cast<P*>(t.data_ptr<at::BFloat16>());
  return t.dim() == 2 ? Bf16Rows<P>{base, t.stride(0), 0} : Bf16Rows<P>{base, t.stride(0), t.stride(1)};
}

// One call's operands. The block: each sequence's L rows of `width` bfloat16 columns, the keys at
// column width - 2·H·W and the values at width - H·W: the packed projection's rows (width
// 3·H·W, queries at column 0) or the last-slot entry's keys' and values' (width 2·H·W, its one
// query row apart, in q). A sequence's block is widened in one pass over its rows (a row is
// contiguous), then the float kernels above read it in place.
struct Staged {
  Bf16Rows<const uint16_t> block;
  int64_t width;
  const float* block_bias;            // [width]
  Bf16Rows<const uint16_t> q;         // p null: the queries are the block's first H·W columns
  const float* q_bias;                // [H·W], with q
  const bool* pad;
  int64_t B, H, W, L, Lq;
  float *S, *c;
  const float* pad_key = nullptr;  // pad keys (float, biased), as Args takes them, or null
  const float* pad_value = nullptr;
  const int64_t* pad_count = nullptr;
  bool separate_query() const { return q.p != nullptr; }
};

// Rows [0, n) of sequence b, `width` wide, into buf [n x width] as float, plus bias (null: none).
// (Fetching sequence b + 1's rows ahead from here made a LinRec training step slower, 186 -> 193
// ms: the prefetches queue behind the loads they are meant to overlap.)
__attribute__((always_inline)) inline void widen_rows(Bf16Rows<const uint16_t> src, int64_t b, int64_t n,
                                                      int64_t width, const float* __restrict__ bias,
                                                      float* __restrict__ buf) {
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* __restrict__ x = src.row(b, t);
    float* __restrict__ y = buf + t * width;
    if (bias) {
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) y[i] = from_bf16(x[i]) + bias[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) y[i] = from_bf16(x[i]);
    }
  }
}

// buf [n x width] rounded into rows [0, n) of sequence b, and (sums not null) each column's sum
// into sums[i], four rows added before each update of sums.
__attribute__((always_inline)) inline void narrow_rows(const float* __restrict__ buf, int64_t n, int64_t width,
                                                       Bf16Rows<uint16_t> dst, int64_t b, float* __restrict__ sums) {
  for (int64_t t = 0; t < n; ++t) {
    const float* __restrict__ x = buf + t * width;
    uint16_t* __restrict__ y = dst.row(b, t);
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) y[i] = to_bf16(x[i]);
  }
  if (!sums) return;
  std::fill(sums, sums + width, 0.0f);
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* __restrict__ x = buf + t * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) sums[i] += (x[i] + x[width + i]) + (x[2 * width + i] + x[3 * width + i]);
  }
  for (; t < n; ++t) {
    const float* __restrict__ x = buf + t * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) sums[i] += x[i];
  }
}

// The float kernels' arguments on one sequence's staged block (and query rows, when separate):
// their views ignore b (sb = 0), the padding row is still found by b.
inline Args<float> staged_args(const Staged& s, const float* block, const float* q) {
  const int64_t HW = s.H * s.W, k0 = s.width - 2 * HW;
  const View<const float> qv = s.separate_query() ? View<const float>{q, 0, s.W, HW}
                                                  : View<const float>{block, 0, s.W, s.width};
  Args<float> a{qv, {block + k0, 0, s.W, s.width}, {block + k0 + HW, 0, s.W, s.width}, s.pad, s.B, s.H, s.L, s.W, s.W,
                s.Lq};
  a.pad_key = s.pad_key;
  a.pad_value = s.pad_value;
  a.pad_count = s.pad_count;
  return a;
}

template <int kW>
__attribute__((always_inline)) inline void staged_forward_any(const Staged& s, Bf16Rows<uint16_t> out, int64_t begin,
                                                              int64_t end) {
  const int64_t H = s.H, W = s.W, HW = H * W;
  std::vector<float> block(s.L * s.width), q(s.separate_query() ? s.Lq * HW : 0), o(s.Lq * HW),
      scratch(scratch_elements(H, W, W));
  std::vector<const float*> ptrs(2 * H * kGroup);
  std::vector<float*> outs(H * (kGroup + 1));
  for (int64_t b = begin; b < end; ++b) {
    widen_rows(s.block, b, s.L, s.width, s.block_bias, block.data());
    if (s.separate_query()) widen_rows(s.q, b, s.Lq, HW, s.q_bias, q.data());
    forward_seq<float, kW, kW>(staged_args(s, block.data(), q.data()), b, View<float>{o.data(), 0, W, HW},
                               s.S + b * H * W * W, s.c + b * H * W, scratch.data(), ptrs.data(), outs.data());
    narrow_rows(o.data(), s.Lq, HW, out, b, nullptr);
  }
}

// g: the output's gradient; gblock (laid out as the block) and gq (when the query is separate):
// the inputs'; sums [B x 3·H·W]: sequence b's column sums of its query gradient, then of its keys'
// and values' (the packed block's columns in order); gpad: each sequence's pad-key gradients.
template <int kW>
__attribute__((always_inline)) inline void staged_backward_any(const Staged& s, Bf16Rows<const uint16_t> g,
                                                               Bf16Rows<uint16_t> gblock, Bf16Rows<uint16_t> gq,
                                                               float* sums, PadGrads<float> gpad, int64_t begin,
                                                               int64_t end) {
  const int64_t H = s.H, W = s.W, HW = H * W, k0 = s.width - 2 * HW;
  const bool separate = s.separate_query();
  std::vector<float> block(s.L * s.width), q(separate ? s.Lq * HW : 0), go(s.Lq * HW), gb(s.L * s.width),
      gqb(separate ? s.Lq * HW : 0), scratch(scratch_elements(H, W, W));
  std::vector<const float*> cptrs(3 * H * kGroup);
  std::vector<float*> mptrs(3 * H * kGroup);
  std::vector<QueryRow<float>> qrows(H * kGroup);
  const View<float> gqv = separate ? View<float>{gqb.data(), 0, W, HW} : View<float>{gb.data(), 0, W, s.width};
  for (int64_t b = begin; b < end; ++b) {
    widen_rows(s.block, b, s.L, s.width, s.block_bias, block.data());
    if (separate) widen_rows(s.q, b, s.Lq, HW, s.q_bias, q.data());
    widen_rows(g, b, s.Lq, HW, nullptr, go.data());
    backward_seq<float, kW, kW>(staged_args(s, block.data(), q.data()), b, View<const float>{go.data(), 0, W, HW},
                                s.S + b * H * W * W, s.c + b * H * W, gqv, View<float>{gb.data() + k0, 0, W, s.width},
                                View<float>{gb.data() + k0 + HW, 0, W, s.width}, gpad, scratch.data(), cptrs.data(),
                                mptrs.data(), qrows.data());
    float* sb = sums + b * 3 * HW;
    narrow_rows(gb.data(), s.L, s.width, gblock, b, sb + 3 * HW - s.width);
    if (separate) narrow_rows(gqb.data(), s.Lq, HW, gq, b, sb);
  }
}

// One launch of either pass: the forward's output, or the backward's gradients and sums.
struct StagedCall {
  Staged s;
  Bf16Rows<uint16_t> out;
  Bf16Rows<const uint16_t> g;
  Bf16Rows<uint16_t> gblock, gq;
  float* sums;
  PadGrads<float> gpad;
};

template <int kW, bool kBackward>
__attribute__((always_inline)) inline void staged_range_any(const StagedCall& c, int64_t begin, int64_t end) {
  if constexpr (kBackward) staged_backward_any<kW>(c.s, c.g, c.gblock, c.gq, c.sums, c.gpad, begin, end);
  else staged_forward_any<kW>(c.s, c.out, begin, end);
}
template <int kW, bool kBackward>
void staged_range(const StagedCall& c, int64_t begin, int64_t end) {
  staged_range_any<kW, kBackward>(c, begin, end);
}
#if SEQREC_CPU_X86
template <int kW, bool kBackward>
SEQREC_CPU_AVX2 void staged_range_avx2(const StagedCall& c, int64_t begin, int64_t end) {
  staged_range_any<kW, kBackward>(c, begin, end);
}
template <int kW, bool kBackward>
SEQREC_CPU_AVX512 void staged_range_avx512(const StagedCall& c, int64_t begin, int64_t end) {
  staged_range_any<kW, kBackward>(c, begin, end);
}
#endif

template <bool kBackward>
void launch_staged(const StagedCall& c) {
  with_width(c.s.W, c.s.W, [&](auto width) {
    constexpr int W = decltype(width)::value;
    at::parallel_for(0, c.s.B, 1, [&](int64_t begin, int64_t end) {
#if SEQREC_CPU_X86
      if constexpr (W == 16)
        if (cpu_has_avx512()) return staged_range_avx512<W, kBackward>(c, begin, end);
      if (cpu_has_avx2_fma()) return staged_range_avx2<W, kBackward>(c, begin, end);
#endif
      staged_range<W, kBackward>(c, begin, end);
    });
  });
}

void launch_staged_forward(const Staged& s, Bf16Rows<uint16_t> out) {
  launch_staged<false>({s, out, {}, {}, {}, nullptr, {}});
}

// Returns the biases' gradient [3·H·W] (the query's, then the keys' and values'): each sequence's
// column sums in float, added over the sequences in order in double. gpad: where each sequence's
// pad-key gradients go.
at::Tensor launch_staged_backward(const Staged& s, Bf16Rows<const uint16_t> g, Bf16Rows<uint16_t> gblock,
                                  Bf16Rows<uint16_t> gq, PadGrads<float> gpad) {
  const int64_t N = 3 * s.H * s.W;
  std::vector<float> sums(s.B * N);
  float* sp = sums.data();
  launch_staged<true>({s, {}, g, gblock, gq, sp, gpad});
  std::vector<double> total(N, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < N; ++i) total[i] += sp[b * N + i];
  auto out = torch::empty({N}, torch::kFloat);
  std::copy(total.begin(), total.end(), out.data_ptr<float>());
  return out;
}

// Each class takes the pad keys as three more inputs (key, value, count) and returns the key's and
// value's gradients; without pad keys the three are Padded's stand-ins.

// The pad keys of a saved list, from position i (key, value, count).
PadTensors saved_pad(const variable_list& saved, size_t i) { return {saved[i], saved[i + 1], saved[i + 2]}; }

// q, k, v as separate [B, H, L, *] tensors.
class LinrecGlobalPaperFused : public torch::autograd::Function<LinrecGlobalPaperFused> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& key_padding, const at::Tensor& pad_key,
                               const at::Tensor& pad_value, const at::Tensor& pad_count) {
    auto q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
    auto pad = key_padding.contiguous();
    const PadTensors pk(pad_key, pad_value, pad_count);
    const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), E = v.size(3);
    auto out = empty_heads(B, H, L, E, v.options());
    auto S = torch::empty({B, H, D, E}, v.options()), c = torch::empty({B, H, D}, v.options());
    launch_forward(q, k, v, pad, pk, out, S, c);
    ctx->save_for_backward({q, k, v, pad, S, c, pk.key, pk.value, pk.count});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), E = v.size(3);
    auto gq = empty_heads(B, H, L, D, q.options()), gk = empty_heads(B, H, L, D, k.options()),
         gv = empty_heads(B, H, L, E, v.options());
    auto [gpk, gpv] = launch_backward(q, k, v, saved[3], saved_pad(saved, 6), saved[4], saved[5],
                                      rows_contiguous(grads[0]), gq, gk, gv);
    return {gq, gk, gv, at::Tensor(), gpk, gpv, at::Tensor()};
  }
};

// The packed projection [B, L, 3·D] (queries, keys, values, each H heads of D / H).
class LinrecGlobalPaperPacked : public torch::autograd::Function<LinrecGlobalPaperPacked> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv_in, const at::Tensor& key_padding,
                               int64_t heads, const at::Tensor& pad_key, const at::Tensor& pad_value,
                               const at::Tensor& pad_count) {
    auto qkv = rows_contiguous(qkv_in);
    auto pad = key_padding.contiguous();
    const PadTensors pk(pad_key, pad_value, pad_count);
    const int64_t B = qkv.size(0), L = qkv.size(1), D = qkv.size(2) / 3, W = D / heads;
    auto out = torch::empty({B, L, D}, qkv.options());
    auto S = torch::empty({B, heads, W, W}, qkv.options()), c = torch::empty({B, heads, W}, qkv.options());
    launch_forward(heads_of(qkv, heads, W, 0), heads_of(qkv, heads, W, D), heads_of(qkv, heads, W, 2 * D), pad, pk,
                   heads_of(out, heads, W, 0), S, c);
    ctx->save_for_backward({qkv, pad, S, c, pk.key, pk.value, pk.count});
    ctx->saved_data["heads"] = heads;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& qkv = saved[0];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t D = qkv.size(2) / 3, W = D / heads;
    auto g = rows_contiguous(grads[0]);
    auto gqkv = torch::empty({qkv.size(0), qkv.size(1), 3 * D}, qkv.options());
    auto [gpk, gpv] = launch_backward(heads_of(qkv, heads, W, 0), heads_of(qkv, heads, W, D),
                                      heads_of(qkv, heads, W, 2 * D), saved[1], saved_pad(saved, 4), saved[2],
                                      saved[3], heads_of(g, heads, W, 0), heads_of(gqkv, heads, W, 0),
                                      heads_of(gqkv, heads, W, D), heads_of(gqkv, heads, W, 2 * D));
    return {gqkv, at::Tensor(), at::Tensor(), gpk, gpv, at::Tensor()};
  }
};

// The last slot's query [B, D] against the packed keys and values [B, L, 2·D] of every slot.
class LinrecGlobalPaperLast : public torch::autograd::Function<LinrecGlobalPaperLast> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& kv_in,
                               const at::Tensor& key_padding, int64_t heads, const at::Tensor& pad_key,
                               const at::Tensor& pad_value, const at::Tensor& pad_count) {
    auto q = rows_contiguous(q_in), kv = rows_contiguous(kv_in);
    auto pad = key_padding.contiguous();
    const PadTensors pk(pad_key, pad_value, pad_count);
    const int64_t B = q.size(0), D = q.size(1), W = D / heads;
    auto out = torch::empty({B, D}, q.options());
    auto S = torch::empty({B, heads, W, W}, q.options()), c = torch::empty({B, heads, W}, q.options());
    launch_forward(heads_of(q, heads, W, 0), heads_of(kv, heads, W, 0), heads_of(kv, heads, W, D), pad, pk,
                   heads_of(out, heads, W, 0), S, c);
    ctx->save_for_backward({q, kv, pad, S, c, pk.key, pk.value, pk.count});
    ctx->saved_data["heads"] = heads;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &kv = saved[1];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t D = q.size(1), W = D / heads;
    auto g = rows_contiguous(grads[0]);
    auto gq = torch::empty_like(q), gkv = torch::empty_like(kv);
    auto [gpk, gpv] = launch_backward(heads_of(q, heads, W, 0), heads_of(kv, heads, W, 0), heads_of(kv, heads, W, D),
                                      saved[2], saved_pad(saved, 5), saved[3], saved[4], heads_of(g, heads, W, 0),
                                      heads_of(gq, heads, W, 0), heads_of(gkv, heads, W, 0),
                                      heads_of(gkv, heads, W, D));
    return {gq, gkv, at::Tensor(), at::Tensor(), gpk, gpv, at::Tensor()};
  }
};

// The staged kernels' pad keys (float) from their tensors.
void set_pad(Staged& s, const PadTensors& p) {
  if (!p.count.defined()) return;
  s.pad_key = p.key.data_ptr<float>();
  s.pad_value = p.value.data_ptr<float>();
  s.pad_count = p.count.data_ptr<int64_t>();
}

// The packed bfloat16 product [B, L, 3·D] of the queries', keys' and values' projection, before
// its bias [3·D]; output [B, L, D] in bfloat16.
class LinrecGlobalPaperPackedBf16 : public torch::autograd::Function<LinrecGlobalPaperPackedBf16> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& product_in, const at::Tensor& bias_in,
                               const at::Tensor& key_padding, int64_t heads, const at::Tensor& pad_key,
                               const at::Tensor& pad_value, const at::Tensor& pad_count) {
    auto product = product_in.contiguous(), bias = bias_in.contiguous();
    auto pad = key_padding.contiguous();
    const PadTensors pk(pad_key, pad_value, pad_count);
    const int64_t B = product.size(0), L = product.size(1), D = product.size(2) / 3, W = D / heads;
    auto out = torch::empty({B, L, D}, product.options());
    auto S = torch::empty({B, heads, W, W}, bias.options()), c = torch::empty({B, heads, W}, bias.options());
    launch_staged_forward(staged(product, bias, pad, heads, S, c, pk), bf16_rows<uint16_t>(out));
    ctx->save_for_backward({product, bias, pad, S, c, pk.key, pk.value, pk.count});
    ctx->saved_data["heads"] = heads;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& product = saved[0];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    auto g = grads[0].to(at::kBFloat16).contiguous();
    auto gproduct = torch::empty_like(product);
    const PadTensors pk = saved_pad(saved, 5);
    const PadGradTensors gpad(pk, product.size(0));
    auto gbias = launch_staged_backward(staged(product, saved[1], saved[2], heads, saved[3], saved[4], pk),
                                        bf16_rows<const uint16_t>(g), bf16_rows<uint16_t>(gproduct), {},
                                        gpad.grads<float>());
    return {gproduct, gbias, at::Tensor(), at::Tensor(), gpad.key_sum(), gpad.value_sum(), at::Tensor()};
  }

 private:
  static Staged staged(const at::Tensor& product, const at::Tensor& bias, const at::Tensor& pad, int64_t heads,
                       const at::Tensor& S, const at::Tensor& c, const PadTensors& pk) {
    const int64_t B = product.size(0), L = product.size(1), D = product.size(2) / 3;
    Staged s{bf16_rows<const uint16_t>(product), 3 * D, bias.data_ptr<float>(), {}, nullptr, pad.data_ptr<bool>(),
             B, heads, D / heads, L, L, S.data_ptr<float>(), c.data_ptr<float>()};
    set_pad(s, pk);
    return s;
  }
};

// The last slot's bfloat16 query product [B, D] and every slot's key and value product
// [B, L, 2·D], before their biases [D] and [2·D]; output [B, D] in bfloat16.
class LinrecGlobalPaperLastBf16 : public torch::autograd::Function<LinrecGlobalPaperLastBf16> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& q_bias_in,
                               const at::Tensor& kv_in, const at::Tensor& kv_bias_in, const at::Tensor& key_padding,
                               int64_t heads, const at::Tensor& pad_key, const at::Tensor& pad_value,
                               const at::Tensor& pad_count) {
    auto q = q_in.contiguous(), kv = kv_in.contiguous(), q_bias = q_bias_in.contiguous(),
         kv_bias = kv_bias_in.contiguous();
    auto pad = key_padding.contiguous();
    const PadTensors pk(pad_key, pad_value, pad_count);
    const int64_t B = q.size(0), D = q.size(1), W = D / heads;
    auto out = torch::empty({B, D}, q.options());
    auto S = torch::empty({B, heads, W, W}, q_bias.options()), c = torch::empty({B, heads, W}, q_bias.options());
    launch_staged_forward(staged(q, q_bias, kv, kv_bias, pad, heads, S, c, pk), bf16_rows<uint16_t>(out));
    ctx->save_for_backward({q, q_bias, kv, kv_bias, pad, S, c, pk.key, pk.value, pk.count});
    ctx->saved_data["heads"] = heads;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &kv = saved[2];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t D = q.size(1);
    auto g = grads[0].to(at::kBFloat16).contiguous();
    auto gq = torch::empty_like(q), gkv = torch::empty_like(kv);
    const PadTensors pk = saved_pad(saved, 7);
    const PadGradTensors gpad(pk, q.size(0));
    auto gbias = launch_staged_backward(staged(q, saved[1], kv, saved[3], saved[4], heads, saved[5], saved[6], pk),
                                        bf16_rows<const uint16_t>(g), bf16_rows<uint16_t>(gkv),
                                        bf16_rows<uint16_t>(gq), gpad.grads<float>());
    return {gq,           gbias.narrow(0, 0, D), gkv,           gbias.narrow(0, D, 2 * D), at::Tensor(),
            at::Tensor(), gpad.key_sum(),        gpad.value_sum(), at::Tensor()};
  }

 private:
  static Staged staged(const at::Tensor& q, const at::Tensor& q_bias, const at::Tensor& kv, const at::Tensor& kv_bias,
                       const at::Tensor& pad, int64_t heads, const at::Tensor& S, const at::Tensor& c,
                       const PadTensors& pk) {
    const int64_t B = q.size(0), D = q.size(1);
    Staged s{bf16_rows<const uint16_t>(kv), 2 * D, kv_bias.data_ptr<float>(), bf16_rows<const uint16_t>(q),
             q_bias.data_ptr<float>(), pad.data_ptr<bool>(), B, heads, D / heads, kv.size(1), 1,
             S.data_ptr<float>(), c.data_ptr<float>()};
    set_pad(s, pk);
    return s;
  }
};

// The pad keys as the classes take them: LibTorch 1.13's Function::apply refuses undefined
// inputs, so "none" is three empty one-dimensional tensors (a key is [H, D]).
struct Padded {
  at::Tensor key, value, count;
  explicit Padded(const LinrecPadKeys& p) {
    if (p.defined()) {
      key = p.key;
      value = p.value;
      count = p.count;
    } else {
      key = value = torch::empty({0});
      count = torch::empty({0}, torch::kLong);
    }
  }
};

}  // namespace

at::Tensor linrec_global_paper_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_padding, const LinrecPadKeys& pad_keys) {
  const Padded p(pad_keys);
  return LinrecGlobalPaperFused::apply(q, k, v, key_padding, p.key, p.value, p.count)[0];
}

at::Tensor linrec_global_paper_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_padding,
                                      const LinrecPadKeys& pad_keys) {
  const Padded p(pad_keys);
  return LinrecGlobalPaperPacked::apply(qkv, key_padding, heads, p.key, p.value, p.count)[0];
}

at::Tensor linrec_global_paper_last(const at::Tensor& q, const at::Tensor& kv, int64_t heads,
                                    const at::Tensor& key_padding, const LinrecPadKeys& pad_keys) {
  const Padded p(pad_keys);
  return LinrecGlobalPaperLast::apply(q, kv, key_padding, heads, p.key, p.value, p.count)[0];
}

at::Tensor linrec_global_paper_packed_bf16(const at::Tensor& product, const at::Tensor& bias, int64_t heads,
                                          const at::Tensor& key_padding, const LinrecPadKeys& pad_keys) {
  const Padded p(pad_keys);
  return LinrecGlobalPaperPackedBf16::apply(product, bias, key_padding, heads, p.key, p.value, p.count)[0];
}

at::Tensor linrec_global_paper_last_bf16(const at::Tensor& q, const at::Tensor& q_bias, const at::Tensor& kv,
                                         const at::Tensor& kv_bias, int64_t heads, const at::Tensor& key_padding,
                                         const LinrecPadKeys& pad_keys) {
  const Padded p(pad_keys);
  return LinrecGlobalPaperLastBf16::apply(q, q_bias, kv, kv_bias, key_padding, heads, p.key, p.value, p.count)[0];
}

}  // namespace seqrec::ops
