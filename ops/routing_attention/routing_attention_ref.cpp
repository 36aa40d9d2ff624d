#include "ops/routing_attention/routing_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/op_checks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace seqrec::ops {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using detail::check_key_padding;

void check_float4(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && at::isFloatingType(x.scalar_type()), name, " must be float [B, H, L, d]; got ",
              x.sizes(), " ", x.scalar_type());
}

}  // namespace

RoutingPlan causal_balanced_routing(const at::Tensor& r, const at::Tensor& centroids,
                                    const at::Tensor& key_padding, int64_t window, int64_t chunk) {
  check_float4(r, "r");
  const int64_t B = r.size(0), H = r.size(1), L = r.size(2), d = r.size(3);
  TORCH_CHECK(centroids.dim() == 3 && centroids.size(0) == H && centroids.size(1) >= 1 && centroids.size(2) == d &&
                  centroids.scalar_type() == r.scalar_type(),
              "centroids must be [H, K, d] with H = ", H, ", K >= 1, d = ", d, " of r's dtype ", r.scalar_type(),
              "; got ", centroids.sizes(), " ", centroids.scalar_type());
  check_key_padding(key_padding, B, L);
  TORCH_CHECK(window >= 1, "window must be >= 1, got ", window);
  TORCH_CHECK(chunk >= 1, "chunk must be >= 1, got ", chunk);
  const int64_t K = centroids.size(1), W = window, S = chunk;
  auto long_opts = r.options().dtype(at::kLong);
  if (L == 0) {
    return {torch::zeros({B, H, 0}, long_opts), torch::zeros({B, H, 0, W}, long_opts),
            torch::zeros({B, H, 0, W}, long_opts.dtype(at::kBool))};
  }

  torch::NoGradGuard no_grad;
  auto scores = torch::matmul(r.detach(), centroids.detach().transpose(1, 2).unsqueeze(0));  // [B, H, L, K]
  auto cluster = scores.argmax(-1);

  // Left-pad to G whole chunks so that chunk g holds padded positions [g·S, (g+1)·S): the chunks
  // then end at the right edge as the header defines them. Padded and prepended slots score
  // -inf, so they can only fill candidate places that no real slot claims, and read as invalid.
  const int64_t G = (L + S - 1) / S, P = G * S - L;
  auto masked = scores.masked_fill(key_padding.view({B, 1, L, 1}), kNegInf);
  auto chunks = torch::constant_pad_nd(masked, {0, 0, P, 0}, kNegInf)
                    .view({B, H, G, S, K})
                    .permute({0, 1, 2, 4, 3})
                    .contiguous();  // [B, H, G, K, S]
  // Slot index of each padded position (prepended ones clamp to 0; their score is -inf).
  auto slots = (torch::arange(G * S, long_opts) - P).clamp_min(0).view({G, S});

  // Walk the chunks left to right holding, per (b, h, cluster), the top-W of the prefix before
  // the current chunk; each step merges one chunk into it with a topk over W + S entries.
  auto cand_score = torch::full({B, H, K, W}, kNegInf, scores.options());
  auto cand_slot = torch::zeros({B, H, K, W}, long_opts);
  std::vector<at::Tensor> prefix_score, prefix_slot;
  prefix_score.reserve(G);
  prefix_slot.reserve(G);
  for (int64_t g = 0; g < G; ++g) {
    prefix_score.push_back(cand_score);
    prefix_slot.push_back(cand_slot);
    if (g + 1 == G) break;
    auto merged_score = torch::cat({cand_score, chunks.select(2, g)}, -1);
    auto merged_slot = torch::cat({cand_slot, slots[g].expand({B, H, K, S})}, -1);
    auto top = merged_score.topk(W, -1, /*largest=*/true, /*sorted=*/false);
    cand_score = std::get<0>(top);
    cand_slot = merged_slot.gather(-1, std::get<1>(top));
  }

  // Query i reads the candidates of (its chunk, its cluster): row g·K + c of [B, H, G·K, W].
  auto query_chunk = torch::div(torch::arange(L, long_opts) + P, S, "floor");
  auto row = (query_chunk * K + cluster).unsqueeze(-1).expand({B, H, L, W});
  auto win_score = torch::stack(prefix_score, 2).view({B, H, G * K, W}).gather(2, row);
  auto win_slot = torch::stack(prefix_slot, 2).view({B, H, G * K, W}).gather(2, row);
  auto valid = win_score > kNegInf;
  return {cluster, win_slot.masked_fill(valid.logical_not(), 0), valid};
}

namespace detail {

void check_routed_attention_args(const at::Tensor& r, const at::Tensor& v, const RoutingPlan& plan,
                                 const at::Tensor& key_padding, double dropout) {
  check_float4(r, "r");
  const int64_t B = r.size(0), H = r.size(1), L = r.size(2);
  TORCH_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == H && v.size(2) == L &&
                  v.scalar_type() == r.scalar_type() && v.device() == r.device(),
              "v must be [B, H, L, dv] with [B, H, L] = [", B, ", ", H, ", ", L, "] of r's dtype ", r.scalar_type(),
              " on r's device ", r.device(), "; got ", v.sizes(), " ", v.scalar_type(), " on ", v.device());
  check_key_padding(key_padding, B, L);
  TORCH_CHECK(key_padding.device() == r.device(), "key_padding must be on r's device ", r.device(), "; got ",
              key_padding.device());
  TORCH_CHECK(plan.window.defined() && plan.valid.defined(), "plan.window and plan.valid must be defined");
  TORCH_CHECK(plan.window.dim() == 4 && plan.window.size(0) == B && plan.window.size(1) == H &&
                  plan.window.size(2) == L && plan.window.scalar_type() == at::kLong &&
                  plan.window.device() == r.device(),
              "plan.window must be int64 [B, H, L, W] with [B, H, L] = [", B, ", ", H, ", ", L, "] on r's device ",
              r.device(), "; got ", plan.window.sizes(), " ", plan.window.scalar_type(), " on ",
              plan.window.device());
  TORCH_CHECK(plan.valid.sizes() == plan.window.sizes() && plan.valid.scalar_type() == at::kBool &&
                  plan.valid.device() == r.device(),
              "plan.valid must be bool ", plan.window.sizes(), " like plan.window on r's device ", r.device(),
              "; got ", plan.valid.sizes(), " ", plan.valid.scalar_type(), " on ", plan.valid.device());
  if (plan.window.numel() > 0) {
    const int64_t lo = plan.window.min().item<int64_t>(), hi = plan.window.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < L, "plan.window out of range [0, L = ", L, "): min ", lo, ", max ", hi);
  }
  TORCH_CHECK(dropout >= 0 && dropout < 1, "dropout probability must be in [0, 1), got ", dropout);
}

}  // namespace detail

at::Tensor routed_attention_reference(const at::Tensor& r, const at::Tensor& v, const RoutingPlan& plan,
                                      const at::Tensor& key_padding, double scale, double dropout,
                                      bool training) {
  detail::check_routed_attention_args(r, v, plan, key_padding, dropout);
  const int64_t B = r.size(0), H = r.size(1), L = r.size(2), d = r.size(3);
  const int64_t W = plan.window.size(3), dv = v.size(3);

  // One row gather per operand over the flattened [B·H·L] rows (its backward is one index_add,
  // much cheaper than gather's scatter), O(L·W·d) memory.
  auto base = torch::arange(B * H, plan.window.options()).view({B, H, 1, 1}) * L;
  auto rows = (plan.window + base).reshape({-1});
  auto keys = r.reshape({B * H * L, d}).index_select(0, rows).view({B, H, L, W, d});
  auto values = v.reshape({B * H * L, dv}).index_select(0, rows).view({B, H, L, W, dv});
  // The query is its own extra key (always valid, never in its window: window keys precede its
  // chunk), so no row is empty. Mask after scaling so that any scale keeps -inf as -inf.
  // Elementwise products and sums rather than L·B·H one-row matrix products (far slower in BLAS).
  auto window_logits = (keys * r.unsqueeze(-2)).sum(-1).mul(scale);  // [B, H, L, W]
  auto self_logit = (r * r).sum(-1, true).mul(scale);                                // [B, H, L, 1]
  auto logits = torch::cat({window_logits.masked_fill(plan.valid.logical_not(), kNegInf), self_logit}, -1);
  auto probs = ops::dropout(torch::softmax(logits, -1), dropout, training);
  auto out = (probs.narrow(-1, 0, W).unsqueeze(-1) * values).sum(-2) + probs.narrow(-1, W, 1) * v;
  return out.masked_fill(key_padding.view({B, 1, L, 1}), 0.0);
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& key_padding, int64_t window, double dropout, bool training) {
  check_float4(q, "q");
  TORCH_CHECK(k.sizes() == q.sizes() && k.scalar_type() == q.scalar_type(), "k must be ", q.sizes(), " ",
              q.scalar_type(), " like q; got ", k.sizes(), " ", k.scalar_type());
  TORCH_CHECK(v.sizes() == q.sizes() && v.scalar_type() == q.scalar_type(), "v must be ", q.sizes(), " ",
              q.scalar_type(), " like q; got ", v.sizes(), " ", v.scalar_type());
  const int64_t B = q.size(0), L = q.size(2);
  check_key_padding(key_padding, B, L);
  TORCH_CHECK(window >= 1, "window must be >= 1, got ", window);
  if (L == 0) return torch::zeros_like(v);

  // Blocked: with blocks of S = min(window, L) slots, the keys of every query of block g lie in
  // blocks g - 1 and g, so each block is one dense [S x 2S] product (batched GEMMs over all
  // blocks) masked to the exact window; O(L·S·d) time and O(L·S) memory. The sequence is
  // left-padded with zero slots to G whole blocks plus one block in front of the first.
  const int64_t S = std::min(window, L), H = q.size(1), d = q.size(3), dv = v.size(3);
  const int64_t G = (L + S - 1) / S, P = G * S - L + S;  // leading zero slots
  auto blocks = [&](const at::Tensor& x) {  // [B, H, G + 1, S, width]
    return torch::constant_pad_nd(x, {0, 0, P, 0}).view({B, H, G + 1, S, x.size(3)});
  };
  auto pairs = [&](const at::Tensor& xb) {  // blocks g - 1 and g side by side: [B, H, G, 2S, width]
    return torch::cat({xb.narrow(2, 0, G), xb.narrow(2, 1, G)}, 3);
  };
  auto qb = blocks(q).narrow(2, 1, G);                             // [B, H, G, S, d]
  auto kb = pairs(blocks(k)), vb = pairs(blocks(v));               // [B, H, G, 2S, .]
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto logits = torch::matmul(qb, kb.transpose(-2, -1)).mul(scale);  // [B, H, G, S, 2S]
  // Query a of a block sees key b of its pair when 0 <= S + a - b < S (the window), unless the
  // key is padding (leading zero slots count as padding); its own slot (b = a + S) always.
  auto a = torch::arange(S, q.options().dtype(at::kLong)).view({S, 1});
  auto b = torch::arange(2 * S, q.options().dtype(at::kLong)).view({1, 2 * S});
  auto outside = (b.le(a)).logical_or(b.gt(a + S));                // [S, 2S]
  auto pad = torch::constant_pad_nd(key_padding.to(at::kByte), {P, 0}, 1).to(at::kBool).view({B, G + 1, S});
  auto key_pad = torch::cat({pad.narrow(1, 0, G), pad.narrow(1, 1, G)}, 2);  // [B, G, 2S]
  auto self = b.eq(a + S);
  auto hidden = (outside.view({1, 1, S, 2 * S}) | key_pad.unsqueeze(2)) & self.logical_not().view({1, 1, S, 2 * S});
  auto probs = ops::dropout(torch::softmax(logits.masked_fill(hidden.unsqueeze(1), kNegInf), -1), dropout, training);
  auto out = torch::matmul(probs, vb).reshape({B, H, G * S, dv}).narrow(2, G * S - L, L);
  return out.masked_fill(key_padding.view({B, 1, L, 1}), 0.0);
}

}  // namespace seqrec::ops
