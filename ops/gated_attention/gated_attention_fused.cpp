// FLASH4Rec's gated attention through the fused kernel (gated_attention_kernel.h): one warp per
// query row forward, per query row and then per key row backward, on a CUDA device
// (gated_attention.cu), or on the CPU with a one-lane warp, rows spread over the threads (what
// the tests run: the same host glue as the device's). It takes the explicit path's cases (the
// softmax form, and either form under active Top-K dropout with its per-row rescale, i.e.
// causal) and never makes an L x L tensor. Top-K dropout draws its seed as the reference does
// (one random_seed() per call) and the kernel hashes dropout_mask's bits, so one generator state
// drops the same entries either way. Also here: Top-K dropout's CPU pass over a materialised A
// (topk_attention_dropout_cpu, what the reference path runs on the CPU).
#include "ops/gated_attention/gated_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/gated_attention/gated_attention_kernel.h"
#include "ops/kernels.h"
#include "ops/op_checks.h"
#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include "ops/cuda_launch.h"
#include "ops/gated_attention/gated_attention_cuda.h"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace seqrec::ops {
namespace {

namespace gk = cuda::gated_kernel;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kEpsilon = 1e-12;  // the reference's kEps

bool topk_active(const GatedAttentionOptions& o) { return o.training && o.topk_dropout > 0 && o.topk > 0; }

// The tensors of one call, contiguous on one device; stats and dropped filled by the forward.
struct GatedCall {
  at::Tensor q, k, v, pad, qn, kn, stats, dropped;
  GatedAttentionOptions o;
  uint64_t seed = 0;

  template <typename T>
  gk::Args<T> args() const {
    gk::Args<T> a{};
    a.q = q.data_ptr<T>();
    a.k = k.data_ptr<T>();
    a.v = v.data_ptr<T>();
    a.pad = pad.data_ptr<bool>();
    a.qn = qn.defined() ? qn.data_ptr<T>() : nullptr;
    a.kn = kn.defined() ? kn.data_ptr<T>() : nullptr;
    a.stats = stats.data_ptr<T>();
    a.dropped = dropped.defined() ? dropped.data_ptr<int32_t>() : nullptr;
    a.B = q.size(0);
    a.H = q.size(1);
    a.L = q.size(2);
    a.s = q.size(3);
    a.e = v.size(3);
    a.topk = o.topk;
    a.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    a.causal = o.causal;
    a.cosine = o.form == GatedAttentionForm::kCosine;
    if (dropped.defined()) {
      a.hash_base = mix64(seed ^ kGolden);
      a.threshold = static_cast<uint32_t>(o.topk_dropout * 65536.0 + 0.5);
    }
    return a;
  }
};

GatedCall gated_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
                     const GatedAttentionOptions& o) {
  GatedCall c;
  c.q = q.contiguous();
  c.k = k.contiguous();
  c.v = v.contiguous();
  c.pad = pad.contiguous();
  c.o = o;
  if (o.form == GatedAttentionForm::kCosine) {
    torch::NoGradGuard no_grad;
    c.qn = c.q.norm(2, -1).contiguous();
    c.kn = c.k.norm(2, -1).contiguous();
  }
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);
  c.stats = at::empty({rows, gk::kStats}, q.options());
  if (topk_active(o)) {
    c.seed = random_seed();  // the reference's one draw, in topk_attention_dropout
    c.dropped = at::empty({rows, o.topk}, q.options().dtype(at::kInt));
  }
  return c;
}

// Runs one pass (0 forward; 1 the backward: its query pass, then its key pass) where `like` lives.
template <typename T>
void run_rows(const gk::Args<T>& a, bool backward, const at::Tensor& like) {
#if SEQREC_HAVE_CUDA
  if (like.is_cuda()) {
    const CudaLaunch launch(like);
    if (backward)
      cuda::gated_attention_backward_launch<T>(a, launch.stream());
    else
      cuda::gated_attention_forward_launch<T>(a, launch.stream());
    return;
  }
#endif
  const int64_t rows = a.B * a.H * a.L;
  // About 64k multiply-adds a row chunk, so that handing a chunk to a thread pays.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, a.L * (a.s + a.e)));
  auto pass = [&](int which) {
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<T> sc(static_cast<size_t>(2 * a.L));
      for (int64_t row = begin; row < end; ++row) {
        cuda::SerialWarp<gk::NoState> warp;
        if (which == 0)
          gk::forward_row<T>(warp, a, row, sc.data());
        else if (which == 1)
          gk::query_row<T>(warp, a, row, sc.data());
        else
          gk::key_row<T>(warp, a, row, sc.data());
      }
    });
  };
  if (!backward) {
    pass(0);
  } else {
    pass(1);  // the key pass reads the query pass's stats
    pass(2);
  }
}

at::Tensor run_forward(const GatedCall& call) {
  auto out = at::empty({call.q.size(0), call.q.size(1), call.q.size(2), call.v.size(3)}, call.v.options());
  AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "fused_gated_attention", [&] {
    auto a = call.args<scalar_t>();
    a.out = out.data_ptr<scalar_t>();
    run_rows<scalar_t>(a, /*backward=*/false, call.q);
  });
  return out;
}

struct FusedGatedAttention : public torch::autograd::Function<FusedGatedAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& pad, int64_t form, bool causal, int64_t topk, double p,
                               bool training) {
    GatedAttentionOptions o;
    o.form = static_cast<GatedAttentionForm>(form);
    o.causal = causal;
    o.topk = topk;
    o.topk_dropout = p;
    o.training = training;
    auto call = gated_call(q, k, v, pad, o);
    auto out = run_forward(call);
    ctx->save_for_backward({call.q, call.k, call.v, call.pad, call.qn, call.kn, call.stats, call.dropped});
    ctx->saved_data["form"] = form;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["topk"] = topk;
    ctx->saved_data["p"] = p;
    ctx->saved_data["training"] = training;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // Grad mode is on here only under create_graph: the kernels build no graph.
    TORCH_CHECK(!at::GradMode::is_enabled(), "gated_attention does not support double backward");
    auto saved = ctx->get_saved_variables();
    GatedCall call;
    call.q = saved[0];
    call.k = saved[1];
    call.v = saved[2];
    call.pad = saved[3];
    call.qn = saved[4];
    call.kn = saved[5];
    call.stats = saved[6].clone();  // the query pass writes its part; a retained graph keeps the forward's
    call.dropped = saved[7];
    call.o.form = static_cast<GatedAttentionForm>(ctx->saved_data["form"].toInt());
    call.o.causal = ctx->saved_data["causal"].toBool();
    call.o.topk = ctx->saved_data["topk"].toInt();
    call.o.topk_dropout = ctx->saved_data["p"].toDouble();
    call.o.training = ctx->saved_data["training"].toBool();
    const auto grad = grad_out[0].contiguous();
    auto gq = at::empty_like(call.q), gk_ = at::empty_like(call.k), gv = at::empty_like(call.v);
    AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "fused_gated_attention_backward", [&] {
      auto a = call.args<scalar_t>();
      a.grad = grad.data_ptr<scalar_t>();
      a.gq = gq.data_ptr<scalar_t>();
      a.gk = gk_.data_ptr<scalar_t>();
      a.gv = gv.data_ptr<scalar_t>();
      run_rows<scalar_t>(a, /*backward=*/true, call.q);
    });
    return {gq, gk_, gv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Top-K attention dropout on the CPU in one pass per matrix (topk_attention_dropout's fused
// path): per row the topk largest visible entries by a partial selection (P descending, the
// lower slot first among equals), dropout_mask's keep bits hashed for those entries only, the
// sums T and K, and A' written once; the rows' dropped slots and the sums are kept for the
// backward. The reference makes about ten [B, H, L, L] tensors (torch::topk's indices, the
// selection, the mask, the kept entries, ...); this makes A' alone.
struct TopkDropoutCpu : public torch::autograd::Function<TopkDropoutCpu> {
  // weights [B, H, L, L], visible [B or 1, H or 1, L, L] bool (contiguous), per_row: one
  // rescale per row, else per (b, h) matrix.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weights, const at::Tensor& visible,
                               int64_t topk, double p, bool per_row) {
    const auto w = weights.contiguous();
    const auto vis = visible.contiguous();
    const int64_t B = w.size(0), H = w.size(1), L = w.size(2), rows = B * H * L;
    auto out = at::empty_like(w);
    auto dropped = at::full({rows, topk}, -1, w.options().dtype(at::kInt));
    auto sums = at::empty({rows, 2}, w.options().dtype(at::kDouble));  // T, K of the row's rescale
    const uint64_t base = mix64(random_seed() ^ kGolden);
    const auto threshold = static_cast<uint32_t>(p * 65536.0 + 0.5);
    const bool vb = vis.size(0) > 1, vh = vis.size(1) > 1;
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "topk_attention_dropout", [&] {
      const scalar_t* W = w.data_ptr<scalar_t>();
      const bool* V = vis.data_ptr<bool>();
      scalar_t* O = out.data_ptr<scalar_t>();
      int32_t* D = dropped.data_ptr<int32_t>();
      double* S = sums.data_ptr<double>();
      at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        std::vector<int64_t> cand(static_cast<size_t>(L));
        for (int64_t bh = begin; bh < end; ++bh) {
          const int64_t b = bh / H, h = bh % H;
          const bool* vm = V + ((vb ? b : 0) * vis.size(1) + (vh ? h : 0)) * L * L;
          double mt = 0, mk = 0;  // the matrix's sums
          for (int64_t i = 0; i < L; ++i) {
            const int64_t row = bh * L + i;
            const scalar_t* wr = W + row * L;
            const bool* vr = vm + i * L;
            int64_t n = 0;
            for (int64_t j = 0; j < L; ++j)
              if (vr[j]) cand[n++] = j;
            auto before = [&](int64_t x, int64_t y) { return wr[x] > wr[y] || (wr[x] == wr[y] && x < y); };
            if (n > topk) std::nth_element(cand.begin(), cand.begin() + topk, cand.begin() + n, before);
            int32_t* dr = D + row * topk;
            int64_t nd = 0;
            for (int64_t r = 0; r < std::min(n, topk); ++r)
              if (gk::drops_element(base, threshold, row * L + cand[r])) dr[nd++] = static_cast<int32_t>(cand[r]);
            double t = 0, k = 0;  // T over every entry (invisible ones are 0), K over the kept ones
            for (int64_t j = 0; j < L; ++j) {
              t += wr[j];
              bool gone = false;
              for (int64_t r = 0; r < nd; ++r) gone = gone || dr[r] == j;
              if (!gone) k += wr[j];
            }
            S[2 * row] = t;
            S[2 * row + 1] = k;
            mt += t;
            mk += k;
          }
          if (!per_row)
            for (int64_t i = 0; i < L; ++i) {
              S[2 * (bh * L + i)] = mt;
              S[2 * (bh * L + i) + 1] = mk;
            }
          for (int64_t i = 0; i < L; ++i) {
            const int64_t row = bh * L + i;
            double& t = S[2 * row];
            double& k = S[2 * row + 1];
            int32_t* dr = D + row * topk;
            if (k <= 0 && t > 0) {  // everything dropped: kept whole
              dr[0] = -1;
              k = t;
            }
            const scalar_t f = static_cast<scalar_t>(t / std::max(k, kEpsilon));
            const scalar_t* wr = W + row * L;
            scalar_t* o = O + row * L;
            for (int64_t j = 0; j < L; ++j) o[j] = wr[j] * f;
            for (int64_t r = 0; r < topk && dr[r] >= 0; ++r) o[dr[r]] = 0;
          }
        }
      });
    });
    ctx->save_for_backward({w, dropped, sums});
    ctx->saved_data["per_row"] = per_row;
    return {out};
  }

  // A' = P ⊙ M · f, f = T / max(K, eps): dP_j = M_j·(f·g_j - G·T/K²·[K >= eps]) + G/max(K, eps),
  // G = sum M·P·g over the row (matrix), for every entry (T sums them all).
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    TORCH_CHECK(!at::GradMode::is_enabled(), "topk_attention_dropout does not support double backward");
    auto saved = ctx->get_saved_variables();
    const auto& w = saved[0];
    const auto& dropped = saved[1];
    const auto& sums = saved[2];
    const bool per_row = ctx->saved_data["per_row"].toBool();
    const auto g = grad_out[0].contiguous();
    const int64_t B = w.size(0), H = w.size(1), L = w.size(2), topk = dropped.size(1);
    auto gw = at::empty_like(w);
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "topk_attention_dropout_backward", [&] {
      const scalar_t* W = w.data_ptr<scalar_t>();
      const scalar_t* G = g.data_ptr<scalar_t>();
      const int32_t* D = dropped.data_ptr<int32_t>();
      const double* S = sums.data_ptr<double>();
      scalar_t* GW = gw.data_ptr<scalar_t>();
      at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        for (int64_t bh = begin; bh < end; ++bh) {
          auto row_g = [&](int64_t row) {  // G of one row: sum over its kept entries of P·g
            const scalar_t* wr = W + row * L;
            const scalar_t* gr = G + row * L;
            double acc = 0;
            for (int64_t j = 0; j < L; ++j) acc += static_cast<double>(wr[j]) * gr[j];
            const int32_t* dr = D + row * topk;
            for (int64_t r = 0; r < topk && dr[r] >= 0; ++r) acc -= static_cast<double>(wr[dr[r]]) * gr[dr[r]];
            return acc;
          };
          double gm = 0;
          if (!per_row)
            for (int64_t i = 0; i < L; ++i) gm += row_g(bh * L + i);
          for (int64_t i = 0; i < L; ++i) {
            const int64_t row = bh * L + i;
            const double t = S[2 * row], k = S[2 * row + 1], kc = std::max(k, kEpsilon);
            const double gs = per_row ? row_g(row) : gm;
            const auto f = static_cast<scalar_t>(t / kc), a = static_cast<scalar_t>(gs / kc);
            const auto bterm = static_cast<scalar_t>(k >= kEpsilon ? gs * t / (kc * kc) : 0.0);
            const scalar_t* gr = G + row * L;
            scalar_t* o = GW + row * L;
            for (int64_t j = 0; j < L; ++j) o[j] = f * gr[j] - bterm + a;
            const int32_t* dr = D + row * topk;
            for (int64_t r = 0; r < topk && dr[r] >= 0; ++r) o[dr[r]] = a;
          }
        }
      });
    });
    return {gw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool gated_attention_kernel_supports(const at::Tensor& q, const at::Tensor& v, const GatedAttentionOptions& o) {
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble) return false;
  if (q.size(2) == 0 || q.size(3) > gk::kMaxDim || v.size(3) > gk::kMaxDim) return false;
  // The linear path (O(L)) is cheaper; Top-K dropout's one rescale per matrix (bidirectional)
  // needs every row at once.
  if (o.form == GatedAttentionForm::kCosine && !topk_active(o)) return false;
  if (topk_active(o) && !o.causal) return false;
#if SEQREC_HAVE_CUDA
  if (q.is_cuda()) return cuda::gated_attention_cuda_fits(q.size(2), static_cast<int64_t>(q.element_size()));
#endif
  return q.device().is_cpu();
}

bool gated_attention_fused_takes(const at::Tensor& q, const at::Tensor& v, const GatedAttentionOptions& o) {
  // On the CPU the reference's GEMMs run the same arithmetic faster than rows of dot products
  // (docs/benchmarks.md), so there the kernel's rows serve the tests only.
  return fused_kernels() && !q.device().is_cpu() && gated_attention_kernel_supports(q, v, o);
}

at::Tensor gated_attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& key_padding, const GatedAttentionOptions& o) {
  if (!detail::grad_wanted({q, k, v})) {
    torch::NoGradGuard no_grad;
    return run_forward(gated_call(q, k, v, key_padding, o));
  }
  return FusedGatedAttention::apply(q, k, v, key_padding, static_cast<int64_t>(o.form), o.causal, o.topk,
                                    o.topk_dropout, o.training)[0];
}

}  // namespace seqrec::ops

namespace seqrec::ops {

at::Tensor topk_attention_dropout_cpu(const at::Tensor& weights, const at::Tensor& visible, int64_t topk, double p,
                                      bool per_row) {
  return TopkDropoutCpu::apply(weights, visible, topk, p, per_row)[0];
}

}  // namespace seqrec::ops
