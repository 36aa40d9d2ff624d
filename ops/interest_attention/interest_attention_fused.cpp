// causal_interest_attention: the aggregation of keys and values and the interest attention in
// one checkpointed scan over chunks of slots (see interest_attention.h).
//
// Per chunk of T slots and per (sequence, interest j), with the state (M, Z, N) entering the
// chunk (running maximum, normaliser and weighted sum of the real rows before the chunk, the last
// two relative to M):
//     m_t      = max(M, max_{real s <= t in the chunk} a[s])                 (a constant)
//     e_t      = exp(M - m_t)                                                (a constant)
//     w[t, s]  = exp(a[s] - m_t) for real s <= t in the chunk, else 0         (<= 1)
//     Z_t      = Z e_t + sum_s w[t, s]
//     agg_t    = (N e_t + sum_s w[t, s] x[s]) / Z_t
// agg_t [k, D] is never formed: the scores need only
//     q_t · agg_t[j] = (e_tj (q_t · N_j) + sum_s w[t, s, j] (q_t · k_s)) / Z_tj
// and the output only
//     sum_j p_tj agg_t[j] = sum_j r_tj e_tj N_j + sum_s (sum_j r_tj w[t, s, j]) v_s,  r = p / Z,
// i.e. per chunk two GEMMs against [N | x] and contractions of w, O(T (D + k H) + k D) per slot.
// Every slot's stabiliser m_t reads only slots <= t, so a slot never depends on a later one,
// not even through rounding.
//
// The forward runs the chunks in order under no-grad and keeps only the state entering each
// chunk. The backward walks the chunks in reverse, recomputes each with autograd from its
// inputs' slices and its entering state (as leaves), and back-propagates (grad of the chunk's
// output, grad of the state leaving it) to the chunk's inputs and the state entering it. The
// maxima are constants: the result does not depend on them, so this is exact.
#include "ops/interest_attention/interest_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/kernels.h"
#include "ops/interest_attention/interest_attention_kernel.h"
#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include "ops/cuda_launch.h"
#include "ops/interest_attention/interest_attention_cuda.h"
#endif

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <tuple>
#include <vector>

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Running state of both aggregations before a chunk: interests [0, k) aggregate the keys,
// [k, 2k) the values.
struct State {
  at::Tensor m;  // [B, 2k] running maximum, -inf while no real row was seen; constant
  at::Tensor z;  // [B, 2k] normaliser relative to m
  at::Tensor n;  // [B, 2k, D] weighted sum relative to m
};

struct ChunkResult {
  at::Tensor out;  // [B, H, T, Dh]
  State next;      // the state after the chunk's last slot
};

// The weights w[t, s, j] = exp(a[s, j] - m[t, j]) for real s <= t (constants: m is) are kept
// packed, row (t, s) at t (t + 1) / 2 + s: w [B, T (T + 1) / 2, 2k]. They enter the chunk's graph
// through two small autograd functions with hand-written loops, so that autograd builds nothing
// of that size: each reads w once forward and once backward and gives the logits the gradient
// d w[t, s, j] / d a[s, j] = w[t, s, j].

inline int64_t tri(int64_t t) { return t * (t + 1) / 2; }

// a [B, T, 2k], pad [B, T], the running maximum M [B, 2k] before the chunk ->
//   m [B, T, 2k]: the largest logit slot t sees (0 where it sees none: any finite value would do),
//   decay [B, T, 2k] = exp(M - m) (0 where M = -inf), and the maximum after the chunk [B, 2k].
std::tuple<at::Tensor, at::Tensor, at::Tensor> running_max(const at::Tensor& a_in, const at::Tensor& pad_in,
                                                           const at::Tensor& M_in) {
  auto a = a_in.contiguous(), M = M_in.contiguous();
  auto pad = pad_in.contiguous();
  const int64_t B = a.size(0), T = a.size(1), K2 = a.size(2);
  auto m = torch::empty({B, T, K2}, a.options());
  auto diff = torch::empty({B, T, K2}, a.options());
  auto next = torch::empty({B, K2}, a.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "interest_running_max", [&] {
    const scalar_t* A = a.data_ptr<scalar_t>();
    const scalar_t* M0 = M.data_ptr<scalar_t>();
    const bool* P = pad.data_ptr<bool>();
    scalar_t* MO = m.data_ptr<scalar_t>();
    scalar_t* DF = diff.data_ptr<scalar_t>();
    scalar_t* NX = next.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        scalar_t* run = NX + b * K2;
        std::copy(M0 + b * K2, M0 + (b + 1) * K2, run);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t bt = b * T + t;
          if (!P[bt])
            for (int64_t j = 0; j < K2; ++j) run[j] = std::max(run[j], A[bt * K2 + j]);
          for (int64_t j = 0; j < K2; ++j) {
            const bool none = std::isinf(run[j]);  // only -inf: nothing seen yet
            MO[bt * K2 + j] = none ? scalar_t(0) : run[j];
            DF[bt * K2 + j] = none ? -std::numeric_limits<scalar_t>::infinity() : M0[b * K2 + j] - run[j];
          }
        }
      }
    });
  });
  return {m, diff.exp_(), next};
}

// a, m [B, T, 2k] (m finite), pad [B, T] -> packed w; exact zeros at padded s.
at::Tensor make_weights(const at::Tensor& a_in, const at::Tensor& m_in, const at::Tensor& pad_in) {
  auto a = a_in.contiguous(), m = m_in.contiguous();
  auto pad = pad_in.contiguous();
  const int64_t B = a.size(0), T = a.size(1), K2 = a.size(2);
  auto w = torch::empty({B, tri(T), K2}, a.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "interest_weights", [&] {
    const scalar_t* A = a.data_ptr<scalar_t>();
    const scalar_t* M = m.data_ptr<scalar_t>();
    const bool* P = pad.data_ptr<bool>();
    scalar_t* W = w.data_ptr<scalar_t>();
    const scalar_t ninf = -std::numeric_limits<scalar_t>::infinity();
    at::parallel_for(0, B * T, 16, [&](int64_t begin, int64_t end) {
      for (int64_t bt = begin; bt < end; ++bt) {
        const int64_t b = bt / T, t = bt % T;
        const scalar_t* mt = M + bt * K2;
        scalar_t* row = W + (b * tri(T) + tri(t)) * K2;
        for (int64_t s = 0; s <= t; ++s, row += K2) {
          const scalar_t* as = A + (b * T + s) * K2;
          if (P[b * T + s]) std::fill(row, row + K2, ninf);
          else for (int64_t j = 0; j < K2; ++j) row[j] = as[j] - mt[j];  // <= 0: no overflow
        }
      }
    });
  });
  return w.exp_();
}

// (a [B, T, 2k], g [B, H, T, S]; w) -> zsum [B, T, 2k] = sum_s w[t, s, :],
//                                      gw [B, H, T, k] = sum_s g[h, t, s] w[t, s, j < k].
// `a` only receives the gradient.
struct WeightSums : public torch::autograd::Function<WeightSums> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& g_in, const at::Tensor& w,
                               int64_t K) {
    auto g = g_in.contiguous();
    const int64_t B = g.size(0), H = g.size(1), T = g.size(2), K2 = w.size(2);
    auto zsum = torch::zeros({B, T, K2}, w.options());
    auto gw = torch::zeros({B, H, T, K}, w.options());
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "weight_sums", [&] {
      const scalar_t* W = w.data_ptr<scalar_t>();
      const scalar_t* G = g.data_ptr<scalar_t>();
      scalar_t* Z = zsum.data_ptr<scalar_t>();
      scalar_t* GW = gw.data_ptr<scalar_t>();
      at::parallel_for(0, B * T, 16, [&](int64_t begin, int64_t end) {
        for (int64_t bt = begin; bt < end; ++bt) {
          const int64_t b = bt / T, t = bt % T;
          scalar_t* z = Z + bt * K2;
          const scalar_t* ws = W + (b * tri(T) + tri(t)) * K2;
          for (int64_t s = 0; s <= t; ++s, ws += K2) {
            for (int64_t j = 0; j < K2; ++j) z[j] += ws[j];
            for (int64_t h = 0; h < H; ++h) {
              const int64_t row = (b * H + h) * T + t;
              const scalar_t gv = G[row * T + s];
              scalar_t* o = GW + row * K;
              for (int64_t j = 0; j < K; ++j) o[j] += gv * ws[j];
            }
          }
        }
      });
    });
    ctx->save_for_backward({g, w});
    ctx->saved_data["K"] = K;
    return {zsum, gw};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &g = saved[0], &w = saved[1];
    const int64_t K = ctx->saved_data["K"].toInt();
    const int64_t B = g.size(0), H = g.size(1), T = g.size(2), K2 = w.size(2);
    auto dz = grads[0].contiguous(), dgw = grads[1].contiguous();
    auto da = torch::zeros({B, T, K2}, w.options());
    auto dg = torch::zeros({B, H, T, T}, w.options());
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "weight_sums_backward", [&] {
      const scalar_t* W = w.data_ptr<scalar_t>();
      const scalar_t* G = g.data_ptr<scalar_t>();
      const scalar_t* DZ = dz.data_ptr<scalar_t>();
      const scalar_t* DGW = dgw.data_ptr<scalar_t>();
      scalar_t* DA = da.data_ptr<scalar_t>();
      scalar_t* DG = dg.data_ptr<scalar_t>();
      at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
        std::vector<scalar_t> dw(K2);
        for (int64_t b = begin; b < end; ++b)
          for (int64_t t = 0; t < T; ++t) {
            const scalar_t* ws = W + (b * tri(T) + tri(t)) * K2;
            const scalar_t* dzt = DZ + (b * T + t) * K2;
            for (int64_t s = 0; s <= t; ++s, ws += K2) {
              for (int64_t j = 0; j < K2; ++j) dw[j] = dzt[j];
              for (int64_t h = 0; h < H; ++h) {
                const int64_t row = (b * H + h) * T + t;
                const scalar_t gv = G[row * T + s];
                const scalar_t* d = DGW + row * K;
                scalar_t acc = 0;
                for (int64_t j = 0; j < K; ++j) {
                  dw[j] += gv * d[j];
                  acc += d[j] * ws[j];
                }
                DG[row * T + s] = acc;
              }
              scalar_t* das = DA + (b * T + s) * K2;
              for (int64_t j = 0; j < K2; ++j) das[j] += ws[j] * dw[j];
            }
          }
      });
    });
    return {da, dg, at::Tensor(), at::Tensor()};
  }
};

// (r [B, H, T, k], a [B, T, 2k]; w) -> att [B, H, T, S] = sum_j r[h, t, j] w[t, s, k + j].
// `a` only receives the gradient (of its value half).
struct ValueWeights : public torch::autograd::Function<ValueWeights> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& r_in, const at::Tensor& a, const at::Tensor& w) {
    auto r = r_in.contiguous();
    const int64_t B = r.size(0), H = r.size(1), T = r.size(2), K = r.size(3), K2 = w.size(2);
    auto att = torch::zeros({B, H, T, T}, w.options());
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "value_weights", [&] {
      const scalar_t* W = w.data_ptr<scalar_t>();
      const scalar_t* R = r.data_ptr<scalar_t>();
      scalar_t* A = att.data_ptr<scalar_t>();
      at::parallel_for(0, B * T, 16, [&](int64_t begin, int64_t end) {
        for (int64_t bt = begin; bt < end; ++bt) {
          const int64_t b = bt / T, t = bt % T;
          for (int64_t h = 0; h < H; ++h) {
            const int64_t row = (b * H + h) * T + t;
            const scalar_t* rr = R + row * K;
            const scalar_t* ws = W + (b * tri(T) + tri(t)) * K2 + K;
            for (int64_t s = 0; s <= t; ++s, ws += K2) {
              scalar_t acc = 0;
              for (int64_t j = 0; j < K; ++j) acc += rr[j] * ws[j];
              A[row * T + s] = acc;
            }
          }
        }
      });
    });
    ctx->save_for_backward({r, w});
    return {att};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &r = saved[0], &w = saved[1];
    const int64_t B = r.size(0), H = r.size(1), T = r.size(2), K = r.size(3), K2 = w.size(2);
    auto datt = grads[0].contiguous();
    auto dr = torch::zeros({B, H, T, K}, w.options());
    auto da = torch::zeros({B, T, K2}, w.options());
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "value_weights_backward", [&] {
      const scalar_t* W = w.data_ptr<scalar_t>();
      const scalar_t* R = r.data_ptr<scalar_t>();
      const scalar_t* DATT = datt.data_ptr<scalar_t>();
      scalar_t* DR = dr.data_ptr<scalar_t>();
      scalar_t* DA = da.data_ptr<scalar_t>();
      at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
        std::vector<scalar_t> dw(K);
        for (int64_t b = begin; b < end; ++b)
          for (int64_t t = 0; t < T; ++t) {
            const scalar_t* ws = W + (b * tri(T) + tri(t)) * K2 + K;
            for (int64_t s = 0; s <= t; ++s, ws += K2) {
              std::fill(dw.begin(), dw.end(), scalar_t(0));
              for (int64_t h = 0; h < H; ++h) {
                const int64_t row = (b * H + h) * T + t;
                const scalar_t d = DATT[row * T + s];
                const scalar_t* rr = R + row * K;
                scalar_t* drr = DR + row * K;
                for (int64_t j = 0; j < K; ++j) {
                  dw[j] += d * rr[j];
                  drr[j] += d * ws[j];
                }
              }
              scalar_t* das = DA + (b * T + s) * K2 + K;
              for (int64_t j = 0; j < K; ++j) das[j] += ws[j] * dw[j];
            }
          }
      });
    });
    return {dr, da, at::Tensor()};
  }
};

// x @ y (same batch dimensions). When `skip`, the product itself is not computed (the result is
// uninitialised): the backward's recompute of a chunk needs only its graph, not the values of the
// chunk's output and of the state leaving it.
struct Product : public torch::autograd::Function<Product> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y, bool skip) {
    ctx->save_for_backward({x, y});
    if (!skip) return {at::matmul(x, y)};
    auto size = x.sizes().vec();
    size.back() = y.size(-1);
    return {at::empty(size, x.options())};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1];
    const auto& g = grads[0];
    at::Tensor gx, gy;
    if (ctx->needs_input_grad(0)) gx = at::matmul(g, y.transpose(-1, -2));
    if (ctx->needs_input_grad(1)) gy = at::matmul(x.transpose(-1, -2), g);
    return {gx, gy, at::Tensor()};
  }
};

// q [B, H, T, Dh]; k, v [B, T, D]; a [B, T, 2k] (key logits, then value logits); pad [B, T];
// mask [B, H, T, k] or undefined. `recompute`: the backward's pass, which needs the graph only.
ChunkResult run_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                      const at::Tensor& pad, const at::Tensor& mask, const State& in, bool recompute) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3), K = a.size(2) / 2;
  ChunkResult res;
  at::Tensor m, decay, w, padded;
  {
    torch::NoGradGuard no_grad;
    padded = pad.unsqueeze(-1);  // [B, T, 1]
    std::tie(m, decay, res.next.m) = running_max(a.detach(), pad, in.m);
    w = make_weights(a.detach(), m, pad);
  }
  auto dk = decay.narrow(2, 0, K), dv = decay.narrow(2, K, K);

  // Scores: (e_tj (q_t · N_j) + sum_s w[t, s, j] (q_t · k_s)) / Z_tj / sqrt(Dh), with q·N and q·k
  // from one product.
  auto nk = torch::cat({in.n.narrow(1, 0, K), k}, 1);                                 // [B, k + S, D]
  auto qnk = torch::matmul(q, nk.reshape({B, K + T, H, Dh}).permute({0, 2, 3, 1}));   // [B, H, T, k + S]
  auto sums = WeightSums::apply(a, qnk.narrow(3, K, T), w, K);
  auto z = torch::addcmul(sums[0], in.z.unsqueeze(1), decay);                          // [B, T, 2k]
  auto zk = z.narrow(2, 0, K), zv = z.narrow(2, K, K);
  auto scale = (1.0 / std::sqrt(static_cast<double>(Dh))) / zk.clamp_min(1e-30);     // [B, T, k]
  auto scores = torch::addcmul(sums[1], qnk.narrow(3, 0, K), dk.unsqueeze(1)) * scale.unsqueeze(1);
  auto p = torch::softmax(scores, -1);
  if (mask.defined()) p = p * mask;

  // Output: sum_j r_tj e_tj N_j + sum_s (sum_j r_tj w[t, s, j]) v_s with r = p / Z, one product.
  auto r = p / zv.clamp_min(1e-30).unsqueeze(1);                                     // [B, H, T, k]
  auto left = torch::cat({r * dv.unsqueeze(1), ValueWeights::apply(r, a, w)[0]}, 3);  // [B, H, T, k + S]
  auto nv = torch::cat({in.n.narrow(1, K, K), v}, 1);                                 // [B, k + S, D]
  res.out = Product::apply(left, nv.reshape({B, K + T, H, Dh}).transpose(1, 2), recompute)[0];  // [B, H, T, Dh]

  // The state after the last slot.
  auto last = (a - m.select(1, T - 1).unsqueeze(1)).masked_fill(padded, -kInf).exp().transpose(1, 2);  // [B, 2k, S]
  auto rows = torch::cat({Product::apply(last.narrow(1, 0, K), k, recompute)[0],
                          Product::apply(last.narrow(1, K, K), v, recompute)[0]},
                         1);
  res.next.n = torch::addcmul(rows, in.n, decay.select(1, T - 1).unsqueeze(-1));
  res.next.z = z.select(1, T - 1);
  return res;
}

State initial_state(int64_t B, int64_t K, int64_t D, const at::TensorOptions& o) {
  return {torch::full({B, 2 * K}, -kInf, o), torch::zeros({B, 2 * K}, o), torch::zeros({B, 2 * K, D}, o)};
}

// Automatic chunk: the per-chunk fixed cost (ATen and autograd calls, per-sequence GEMM calls)
// against the per-slot O(chunk·k) weight loops. Fitted on a 2-core Xeon, 1 thread: B = 128
// (L = 200) is fastest at 16-24, B = 4 (L = 4096) at 32-48.
int64_t pick_chunk(int64_t chunk, int64_t B, int64_t L) {
  if (chunk == 0) {
    const double c = std::sqrt(256.0 + 5400.0 / static_cast<double>(std::max<int64_t>(B, 1)));
    chunk = std::clamp<int64_t>(8 * std::llround(c / 8), 16, 64);
  }
  return std::min(chunk, L);
}

struct Plan {
  int64_t B, H, L, Dh, D, K, C, n;
  int64_t len(int64_t c) const { return std::min(C, L - c * C); }
};

Plan make_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& logits_k, int64_t chunk) {
  Plan p;
  p.B = q.size(0), p.H = q.size(1), p.L = q.size(2), p.Dh = q.size(3), p.D = k.size(2), p.K = logits_k.size(2);
  p.C = pick_chunk(chunk, p.B, p.L);
  p.n = (p.L + p.C - 1) / p.C;
  return p;
}

// The saved states entering every chunk: m, z [n, B, 2k]; n [n, B, 2k, D].
struct Checkpoints {
  at::Tensor m, z, n;
};

// Forward scan over the chunks (a = [logits_k, logits_v] [B, L, 2k]); fills `saved` if given.
at::Tensor scan_forward(const Plan& P, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& a, const at::Tensor& pad, const at::Tensor& mask, Checkpoints* saved) {
  auto out = torch::empty({P.B, P.H, P.L, P.Dh}, q.options());
  auto st = initial_state(P.B, P.K, P.D, k.options());
  if (saved) {
    saved->m = torch::empty({P.n, P.B, 2 * P.K}, k.options());
    saved->z = torch::empty({P.n, P.B, 2 * P.K}, k.options());
    saved->n = torch::empty({P.n, P.B, 2 * P.K, P.D}, k.options());
  }
  for (int64_t c = 0; c < P.n; ++c) {
    const int64_t t0 = c * P.C, T = P.len(c);
    if (saved) {
      saved->m[c].copy_(st.m);
      saved->z[c].copy_(st.z);
      saved->n[c].copy_(st.n);
    }
    auto r = run_chunk(q.narrow(2, t0, T), k.narrow(1, t0, T), v.narrow(1, t0, T), a.narrow(1, t0, T),
                       pad.narrow(1, t0, T), mask.defined() ? mask.narrow(2, t0, T) : at::Tensor(),
                       st, /*recompute=*/false);
    out.narrow(2, t0, T).copy_(r.out);
    st = std::move(r.next);
  }
  return out;
}

at::Tensor make_mask(const at::Tensor& q, int64_t K, double p, uint64_t seed) {
  // Shaped like the reference's attention probabilities [B, H, L, k], so given the same
  // generator state the mask equals the one interest_attention draws.
  return dropout_mask(at::empty({q.size(0), q.size(1), q.size(2), K}, q.options()), p, seed);
}

struct CausalInterestAttention : public torch::autograd::Function<CausalInterestAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& pad,
                               double dropout, bool use_mask, int64_t chunk) {
    auto P = make_plan(q, k, logits_k, chunk);
    at::Tensor mask;
    if (use_mask) {
      const uint64_t seed = random_seed();
      ctx->saved_data["seed"] = static_cast<int64_t>(seed);
      mask = make_mask(q, P.K, dropout, seed);
    }
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["chunk"] = chunk;
    Checkpoints saved;
    auto out = scan_forward(P, q, k, v, torch::cat({logits_k, logits_v}, 2), pad, mask, &saved);
    ctx->save_for_backward({q, k, v, logits_k, logits_v, pad, saved.m, saved.z, saved.n});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // Grad mode is on here only under create_graph: the gradients below are not differentiable.
    TORCH_CHECK(!at::GradMode::is_enabled(), "causal_interest_attention does not support double backward");
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &pad = saved[5];
    const auto a = torch::cat({saved[3], saved[4]}, 2);
    const auto &sm = saved[6], &sz = saved[7], &sn = saved[8];
    auto P = make_plan(q, k, saved[3], ctx->saved_data["chunk"].toInt());
    at::Tensor mask;
    if (ctx->saved_data.count("seed"))
      mask = make_mask(q, P.K, ctx->saved_data["dropout"].toDouble(),
                       static_cast<uint64_t>(ctx->saved_data["seed"].toInt()));
    const auto g = grad_out[0].contiguous();  // an expanded grad would make every per-batch GEMM copy
    const bool need_q = ctx->needs_input_grad(0), need_k = ctx->needs_input_grad(1),
               need_v = ctx->needs_input_grad(2), need_a = ctx->needs_input_grad(3) || ctx->needs_input_grad(4);
    at::Tensor gq, gk, gv, ga;
    if (need_q) gq = torch::empty_like(q, at::MemoryFormat::Contiguous);
    if (need_k) gk = torch::empty_like(k, at::MemoryFormat::Contiguous);
    if (need_v) gv = torch::empty_like(v, at::MemoryFormat::Contiguous);
    if (need_a) ga = torch::empty_like(a);

    // Grad of the state leaving the current chunk (z, n); undefined after the last chunk.
    at::Tensor carry_z, carry_n;
    torch::AutoGradMode grad_mode(true);
    for (int64_t c = P.n - 1; c >= 0; --c) {
      const int64_t t0 = c * P.C, T = P.len(c);
      auto lq = q.narrow(2, t0, T).detach().requires_grad_(need_q);
      auto lk = k.narrow(1, t0, T).detach().requires_grad_(need_k);
      auto lv = v.narrow(1, t0, T).detach().requires_grad_(need_v);
      auto la = a.narrow(1, t0, T).detach().requires_grad_(need_a);
      State in{sm[c], sz[c].detach().requires_grad_(), sn[c].detach().requires_grad_()};
      auto r = run_chunk(lq, lk, lv, la, pad.narrow(1, t0, T),
                         mask.defined() ? mask.narrow(2, t0, T) : at::Tensor(), in, /*recompute=*/true);
      variable_list outs{r.out}, gouts{g.narrow(2, t0, T)};
      if (carry_z.defined()) {
        outs.insert(outs.end(), {r.next.z, r.next.n});
        gouts.insert(gouts.end(), {carry_z, carry_n});
      }
      variable_list wrt;
      at::Tensor* dst[4] = {nullptr, nullptr, nullptr, nullptr};
      at::Tensor slices[4];
      const bool needs[4] = {need_q, need_k, need_v, need_a};
      const at::Tensor leaves[4] = {lq, lk, lv, la};
      at::Tensor* full[4] = {&gq, &gk, &gv, &ga};
      const int64_t dims[4] = {2, 1, 1, 1};  // each input's slot axis
      for (int i = 0; i < 4; ++i)
        if (needs[i]) {
          wrt.push_back(leaves[i]);
          slices[i] = full[i]->narrow(dims[i], t0, T);
          dst[i] = &slices[i];
        }
      const size_t n_inputs = wrt.size();
      if (c > 0) wrt.insert(wrt.end(), {in.z, in.n});
      auto got = torch::autograd::grad(outs, wrt, gouts, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
      for (size_t i = 0, j = 0; i < 4; ++i)
        if (dst[i]) {
          if (got[j].defined()) dst[i]->copy_(got[j]);
          else dst[i]->zero_();
          ++j;
        }
      if (c > 0) {
        carry_z = got[n_inputs];
        carry_n = got[n_inputs + 1];
      }
    }
    at::Tensor gak, gav;
    if (ctx->needs_input_grad(3)) gak = ga.narrow(2, 0, P.K);
    if (ctx->needs_input_grad(4)) gav = ga.narrow(2, P.K, P.K);
    return {gq, gk, gv, gak, gav, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The slot-by-slot scan of interest_attention_kernel.h, one row per (sequence, head): on a CUDA
// device interest_attention.cu's kernels (a warp per row), on the CPU the same row functions with
// a one-lane warp, rows spread over the threads. What the forward keeps for the backward: every
// slot's running maxima, normalisers and scores, and the state entering each chunk of C slots.
// C only trades the checkpoints (L / C states) against the backward's scratch (C slots'
// aggregates), so it is about sqrt(L) unless the caller names one.
int64_t scan_chunk(int64_t chunk, int64_t L) {
  const int64_t C = chunk > 0 ? chunk : std::llround(std::sqrt(static_cast<double>(L)));
  return std::clamp<int64_t>(C, 1, std::max<int64_t>(L, 1));
}

// The tensors of one call: q [B, H, L, Dh], k and v [B, L, D], a [B, L, 2k], pad [B, L] and
// mask [B, H, L, k] (or undefined), contiguous, on one device; m, z [B·H, L, 2k] and
// s [B·H, L, k] filled by the forward; ckpt [B·H, ceil(L / C), 2k, Dh] or undefined.
struct ScanCall {
  at::Tensor q, k, v, a, pad, mask, m, z, s, ckpt;
  int64_t K, C;

  template <typename T>
  cuda::interest_kernel::Args<T> args() const {
    cuda::interest_kernel::Args<T> r{};
    r.q = q.data_ptr<T>();
    r.k = k.data_ptr<T>();
    r.v = v.data_ptr<T>();
    r.a = a.data_ptr<T>();
    r.pad = pad.data_ptr<bool>();
    r.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
    r.m = m.data_ptr<T>();
    r.z = z.data_ptr<T>();
    r.s = s.data_ptr<T>();
    r.ckpt = ckpt.defined() ? ckpt.data_ptr<T>() : nullptr;
    r.B = q.size(0);
    r.H = q.size(1);
    r.L = q.size(2);
    r.Dh = q.size(3);
    r.K = K;
    r.C = C;
    r.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    return r;
  }
};

// Runs the forward (backward = false) or backward rows of `a` where `like` lives.
template <typename T>
void run_rows(const cuda::interest_kernel::Args<T>& a, bool backward, const at::Tensor& like) {
#if SEQREC_HAVE_CUDA
  if (like.is_cuda()) {
    const CudaLaunch launch(like);
    if (backward)
      cuda::interest_attention_backward_launch<T>(a, launch.stream());
    else
      cuda::interest_attention_forward_launch<T>(a, launch.stream());
    return;
  }
#endif
  at::parallel_for(0, a.B * a.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      cuda::SerialWarp<cuda::interest_kernel::NoState> warp;
      if (backward)
        cuda::interest_kernel::backward_row<T>(warp, a, row);
      else
        cuda::interest_kernel::forward_row<T>(warp, a, row);
    }
  });
}

// The forward: the output, with call.m, call.z, call.s (and call.ckpt when defined) filled.
at::Tensor run_scan_forward(const ScanCall& call) {
  const int64_t B = call.q.size(0), H = call.q.size(1), L = call.q.size(2), Dh = call.q.size(3);
  auto out = at::empty({B, H, L, Dh}, call.q.options());
  auto state = at::empty({B * H, 2 * call.K, Dh}, call.q.options());
  auto slot = at::empty({B * H, 7 * call.K}, call.q.options());
  AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "causal_interest_scan", [&] {
    auto a = call.args<scalar_t>();
    a.out = out.data_ptr<scalar_t>();
    a.state = state.data_ptr<scalar_t>();
    a.slot = slot.data_ptr<scalar_t>();
    run_rows<scalar_t>(a, /*backward=*/false, call.q);
  });
  return out;
}

ScanCall scan_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logits_k,
                   const at::Tensor& logits_v, const at::Tensor& pad, const at::Tensor& mask, int64_t chunk,
                   bool keep_checkpoints) {
  ScanCall c;
  c.q = q.contiguous();
  c.k = k.contiguous();
  c.v = v.contiguous();
  c.a = torch::cat({logits_k, logits_v}, 2).contiguous();
  c.pad = pad.contiguous();
  c.mask = mask.defined() ? mask.contiguous() : at::Tensor();
  c.K = logits_k.size(2);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  c.C = scan_chunk(chunk, L);
  c.m = at::empty({B * H, L, 2 * c.K}, q.options());
  c.z = at::empty({B * H, L, 2 * c.K}, q.options());
  c.s = at::empty({B * H, L, c.K}, q.options());
  if (keep_checkpoints) c.ckpt = at::empty({B * H, (L + c.C - 1) / c.C, 2 * c.K, Dh}, q.options());
  return c;
}

struct CausalInterestScan : public torch::autograd::Function<CausalInterestScan> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& pad,
                               double dropout, bool use_mask, int64_t chunk) {
    at::Tensor mask;  // drawn here: an undefined tensor cannot be an input of an autograd Function
    if (use_mask) mask = make_mask(q, logits_k.size(2), dropout, random_seed());
    auto call = scan_call(q, k, v, logits_k, logits_v, pad, mask, chunk, /*keep_checkpoints=*/true);
    auto out = run_scan_forward(call);
    ctx->save_for_backward({call.q, call.k, call.v, call.a, call.pad, call.mask, call.m, call.z, call.s, call.ckpt});
    ctx->saved_data["K"] = call.K;
    ctx->saved_data["C"] = call.C;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // Grad mode is on here only under create_graph: the kernels build no graph.
    TORCH_CHECK(!at::GradMode::is_enabled(), "causal_interest_attention does not support double backward");
    auto saved = ctx->get_saved_variables();
    ScanCall call{saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6], saved[7], saved[8], saved[9],
                  ctx->saved_data["K"].toInt(), ctx->saved_data["C"].toInt()};
    const int64_t B = call.q.size(0), H = call.q.size(1), L = call.q.size(2), Dh = call.q.size(3), K = call.K;
    const auto grad = grad_out[0].contiguous();
    auto gq = at::empty_like(call.q), gk = at::empty_like(call.k), gv = at::empty_like(call.v);
    auto ga = at::empty({B * H, L, 2 * K}, call.q.options());
    auto o = call.q.options();
    auto state = at::empty({B * H, 2 * K, Dh}, o), agg = at::empty({B * H, call.C, 2 * K, Dh}, o);
    auto carry = at::empty({B * H, 2 * K, Dh}, o), carry_c = at::empty({B * H, 2, 2 * K}, o);
    auto slot = at::empty({B * H, 7 * K}, o);
    AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "causal_interest_scan_backward", [&] {
      auto a = call.args<scalar_t>();
      a.state = state.data_ptr<scalar_t>();
      a.grad = grad.data_ptr<scalar_t>();
      a.gq = gq.data_ptr<scalar_t>();
      a.gk = gk.data_ptr<scalar_t>();
      a.gv = gv.data_ptr<scalar_t>();
      a.ga = ga.data_ptr<scalar_t>();
      a.agg = agg.data_ptr<scalar_t>();
      a.carry = carry.data_ptr<scalar_t>();
      a.carry_c = carry_c.data_ptr<scalar_t>();
      a.slot = slot.data_ptr<scalar_t>();
      run_rows<scalar_t>(a, /*backward=*/true, call.q);
    });
    // Each warp wrote its head's share of the logits' gradient.
    auto ga_sum = ga.view({B, H, L, 2 * K}).sum(1);
    at::Tensor gak, gav;
    if (ctx->needs_input_grad(3)) gak = ga_sum.narrow(2, 0, K);
    if (ctx->needs_input_grad(4)) gav = ga_sum.narrow(2, K, K);
    return {gq, gk, gv, gak, gav, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The op through the scan (float, double; on a CUDA device its kernels), with the dropout mask
// drawn as the fused CPU kernel draws it (make_mask), so that one generator state drops the same
// probabilities either way.
at::Tensor scan_causal_interest_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& pad,
                                          double dropout, bool use_mask, bool needs_grad, int64_t chunk) {
  if (!needs_grad) {
    torch::NoGradGuard no_grad;
    at::Tensor mask;
    if (use_mask) mask = make_mask(q, logits_k.size(2), dropout, random_seed());
    return run_scan_forward(scan_call(q, k, v, logits_k, logits_v, pad, mask, chunk, /*keep_checkpoints=*/false));
  }
  return CausalInterestScan::apply(q, k, v, logits_k, logits_v, pad, dropout, use_mask, chunk)[0];
}

// Whether autograd will ask for a gradient of any of `inputs`.
bool grad_wanted(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

// The arguments of causal_interest_attention (and of its scan), checked at the boundary.
void check_causal_interest_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& key_padding,
                                double dropout, int64_t chunk) {
  TORCH_CHECK(q.dim() == 4, "q must be [B, H, L, Dh], got ", q.sizes());
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  TORCH_CHECK(k.dim() == 3 && k.size(0) == B && k.size(1) == L && k.size(2) == H * Dh,
              "k must be [B, L, H*Dh] = [", B, ", ", L, ", ", H * Dh, "]; got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "v must match k ", k.sizes(), "; got ", v.sizes());
  TORCH_CHECK(logits_k.dim() == 3 && logits_k.size(0) == B && logits_k.size(1) == L && logits_k.size(2) >= 1,
              "logits_k must be [B, L, k] with k >= 1 matching q ", q.sizes(), "; got ", logits_k.sizes());
  TORCH_CHECK(logits_v.sizes() == logits_k.sizes(), "logits_v must match logits_k ", logits_k.sizes(),
              "; got ", logits_v.sizes());
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.scalar_type() == at::kBool && key_padding.size(0) == B &&
                  key_padding.size(1) == L,
              "key_padding must be bool [B, L] = [", B, ", ", L, "]; got ", key_padding.sizes());
  TORCH_CHECK(chunk >= 0, "chunk must be >= 0 (0 = automatic), got ", chunk);
  TORCH_CHECK(dropout >= 0 && dropout < 1, "dropout probability must be in [0, 1), got ", dropout);
  for (const auto* t : {&k, &v, &logits_k, &logits_v})
    TORCH_CHECK(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                "q, k, v, logits_k and logits_v must share dtype and device");
  TORCH_CHECK(key_padding.device() == q.device(), "key_padding must be on q's device ", q.device(), "; got ",
              key_padding.device());
}

}  // namespace

at::Tensor causal_interest_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& logits_k, const at::Tensor& logits_v,
                                     const at::Tensor& key_padding, double dropout, bool training, int64_t chunk) {
  check_causal_interest_args(q, k, v, logits_k, logits_v, key_padding, dropout, chunk);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  if (L == 0) return torch::zeros({B, H, 0, Dh}, q.options());
  bool kernel_device = q.device().is_cpu();
#if SEQREC_HAVE_CUDA
  kernel_device = kernel_device || q.is_cuda();
#endif
  if (!fused_kernels() || !kernel_device || (q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble))
    return interest_attention(q, causal_interest_aggregation(k, logits_k, key_padding),
                              causal_interest_aggregation(v, logits_v, key_padding), dropout, training);
  const bool use_mask = training && dropout > 0;
  const bool needs_grad = grad_wanted({q, k, v, logits_k, logits_v});
  if (q.is_cuda())
    return scan_causal_interest_attention(q, k, v, logits_k, logits_v, key_padding, dropout, use_mask, needs_grad,
                                          chunk);
  if (!needs_grad) {
    torch::NoGradGuard no_grad;
    auto P = make_plan(q, k, logits_k, chunk);
    at::Tensor mask;
    if (use_mask) mask = make_mask(q, P.K, dropout, random_seed());
    return scan_forward(P, q, k, v, torch::cat({logits_k, logits_v}, 2), key_padding, mask, nullptr);
  }
  return CausalInterestAttention::apply(q, k, v, logits_k, logits_v, key_padding, dropout, use_mask, chunk)[0];
}

namespace detail {
at::Tensor causal_interest_attention_scan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& logits_k, const at::Tensor& logits_v,
                                          const at::Tensor& key_padding, double dropout, bool training,
                                          int64_t chunk) {
  check_causal_interest_args(q, k, v, logits_k, logits_v, key_padding, dropout, chunk);
  TORCH_CHECK(q.device().is_cpu() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble) &&
                  q.size(2) > 0,
              "causal_interest_attention_scan runs CPU float or double tensors of L > 0 (the device's path is "
              "causal_interest_attention on a CUDA tensor)");
  const bool needs_grad = grad_wanted({q, k, v, logits_k, logits_v});
  return scan_causal_interest_attention(q, k, v, logits_k, logits_v, key_padding, dropout, training && dropout > 0,
                                        needs_grad, chunk);
}
}  // namespace detail

}  // namespace seqrec::ops
