#include "ops/gated_attention/gated_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/kernels.h"
#include "ops/length_slices/length_slices.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/op_checks.h"
#include "ops/products.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace seqrec::ops {
namespace {

// Guards the L2 norms of zero rows, the normaliser of a row whose keys are all antipodal to its
// query, and Top-K dropout's kept mass when everything was dropped.
constexpr double kEps = 1e-12;
// The causal cosine path's chunk: the within-chunk products are [64 x 64], small enough to stay
// in cache, and the cross-chunk states are L/64 matrices of [s+1 x e+1].
constexpr int64_t kChunk = 64;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using detail::check_key_padding;

void check_topk(int64_t topk, double p) {
  TORCH_CHECK(topk >= 0, "topk must be >= 0 (0 = off), got ", topk);
  TORCH_CHECK(p >= 0 && p < 1, "topk_dropout must be in [0, 1), got ", p);
}

void check_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_padding,
              const GatedAttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4 && at::isFloatingType(q.scalar_type()), "q must be float [B, H, L, s]; got ", q.sizes(),
              " ", q.scalar_type());
  TORCH_CHECK(k.sizes() == q.sizes() && k.scalar_type() == q.scalar_type(), "k must be ", q.sizes(), " ",
              q.scalar_type(), " like q; got ", k.sizes(), " ", k.scalar_type());
  check_key_padding(key_padding, q.size(0), q.size(2));
  TORCH_CHECK(options.form == GatedAttentionForm::kSoftmax || options.form == GatedAttentionForm::kCosine,
              "form must be softmax or cosine; got enum value ", static_cast<int>(options.form));
  check_topk(options.topk, options.topk_dropout);
}

at::Tensor l2_normalise(const at::Tensor& x) { return x / x.norm(2, -1, true).clamp_min(kEps); }

// A before Top-K dropout: 0 outside `visible`, rows of padded queries included.
at::Tensor plain_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_padding,
                         const at::Tensor& visible, GatedAttentionForm form) {
  if (form == GatedAttentionForm::kSoftmax) {
    const int64_t B = q.size(0), L = q.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    // The diagonal keeps padded queries' rows finite (a row of -inf would softmax to NaN and
    // poison the gradient); those rows are zeroed after.
    auto allowed = visible | torch::eye(L, visible.options());
    auto scores = ops::matmul(q, k.transpose(-2, -1)).mul(scale).masked_fill(allowed.logical_not(), kNegInf);
    return torch::softmax(scores, -1).masked_fill(key_padding.view({B, 1, L, 1}), 0.0);
  }
  auto sim = ops::matmul(l2_normalise(q), l2_normalise(k).transpose(-2, -1)).add(1.0);
  auto raw = sim.masked_fill(visible.logical_not(), 0.0);
  return raw / raw.sum(-1, true).clamp_min(kEps);
}

// The cosine form without an L x L tensor (see the header): numerator and normaliser from one
// linear-attention product of augmented operands.
at::Tensor cosine_linear(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& key_padding, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), e = v.size(3);
  auto real = key_padding.logical_not().to(q.scalar_type()).view({B, 1, L, 1}).expand({B, H, L, 1});
  // Padded keys and values are zeroed, so they vanish from every sum and from the counts.
  auto qa = torch::cat({torch::ones({B, H, L, 1}, q.options()), l2_normalise(q)}, -1);
  auto ka = torch::cat({real, l2_normalise(k) * real}, -1);
  auto va = torch::cat({v * real, real}, -1);
  auto sums = causal ? causal_linear_attention(qa, ka, va, kChunk)
                     : ops::matmul(qa, ops::matmul(ka.transpose(-2, -1), va));
  auto out = sums.narrow(-1, 0, e) / sums.narrow(-1, e, 1).clamp_min(kEps);
  return out.masked_fill(key_padding.view({B, 1, L, 1}), 0.0);
}

bool topk_dropout_active(int64_t topk, double p, bool training) { return training && p > 0 && topk > 0; }

// weights float [B, H, L, L]; visible bool [B or 1, H or 1, L, L] (broadcast over weights).
void check_weights_visible(const at::Tensor& weights, const at::Tensor& visible) {
  TORCH_CHECK(weights.dim() == 4 && weights.size(2) == weights.size(3) && at::isFloatingType(weights.scalar_type()),
              "weights must be float [B, H, L, L]; got ", weights.sizes(), " ", weights.scalar_type());
  TORCH_CHECK(visible.dim() == 4 && visible.scalar_type() == at::kBool && visible.size(2) == weights.size(2) &&
                  visible.size(3) == weights.size(3) && (visible.size(0) == 1 || visible.size(0) == weights.size(0)) &&
                  (visible.size(1) == 1 || visible.size(1) == weights.size(1)),
              "visible must be bool [B or 1, H or 1, L, L] for weights ", weights.sizes(), "; got ", visible.sizes(),
              " ", visible.scalar_type());
}

}  // namespace

GatedAttentionForm parse_gated_attention_form(const std::string& name) {
  if (name == "softmax") return GatedAttentionForm::kSoftmax;
  if (name == "cosine") return GatedAttentionForm::kCosine;
  throw std::invalid_argument("unknown gated attention form '" + name + "' (known: softmax, cosine)");
}

const char* gated_attention_form_name(GatedAttentionForm form) {
  return form == GatedAttentionForm::kSoftmax ? "softmax" : "cosine";
}

at::Tensor gated_attention_visibility(const at::Tensor& key_padding, bool causal) {
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.scalar_type() == at::kBool,
              "key_padding must be bool [B, L]; got ", key_padding.sizes(), " ", key_padding.scalar_type());
  const int64_t L = key_padding.size(1);
  auto real = key_padding.logical_not();
  auto visible = real.unsqueeze(2) & real.unsqueeze(1);  // [B, L, L]: query i and key j both real
  if (causal) visible = visible & torch::ones({L, L}, key_padding.options()).tril();
  return visible.unsqueeze(1);
}

at::Tensor topk_positions(const at::Tensor& weights, const at::Tensor& visible, int64_t topk) {
  check_weights_visible(weights, visible);
  TORCH_CHECK(topk >= 1, "topk must be >= 1, got ", topk);
  const int64_t L = weights.size(3);
  auto selected = torch::zeros(weights.sizes(), weights.options().dtype(at::kBool));
  if (L == 0) return selected;
  torch::NoGradGuard no_grad;
  // Invisible entries rank below every visible one (even a visible 0), and are removed again
  // where a row has fewer than topk visible entries and topk had to take some.
  auto ranked = weights.detach().masked_fill(visible.logical_not(), kNegInf);
  auto index = std::get<1>(ranked.topk(std::min(topk, L), -1, /*largest=*/true, /*sorted=*/false));
  return selected.scatter_(-1, index, true) & visible;
}

at::Tensor topk_attention_dropout(const at::Tensor& weights, const at::Tensor& visible, int64_t topk, double p,
                                  bool training, bool per_row) {
  check_topk(topk, p);
  if (!topk_dropout_active(topk, p, training)) return weights;
  if (fused_kernels() && weights.device().is_cpu() &&
      (weights.scalar_type() == at::kFloat || weights.scalar_type() == at::kDouble)) {
    check_weights_visible(weights, visible);
    return topk_attention_dropout_cpu(weights, visible, topk, p, per_row);
  }
  return topk_attention_dropout_reference(weights, visible, topk, p, training, per_row);
}

at::Tensor topk_attention_dropout_reference(const at::Tensor& weights, const at::Tensor& visible, int64_t topk,
                                            double p, bool training, bool per_row) {
  check_topk(topk, p);
  if (!topk_dropout_active(topk, p, training)) return weights;
  auto selected = topk_positions(weights, visible, topk);
  auto dropped = selected & dropout_mask(weights, p, random_seed()).eq(0);
  // One scalar per (b, h) matrix (the corrected Eq. 9), or per row; entries outside `visible`
  // are 0, so these sums are the sums over visible entries. A row (matrix) that would lose all
  // its mass (a first slot that sees only itself) is kept whole: no rescale can restore it.
  const std::vector<int64_t> dims = per_row ? std::vector<int64_t>{-1} : std::vector<int64_t>{-2, -1};
  auto total = weights.sum(dims, true);
  auto kept = weights.masked_fill(dropped, 0.0);
  auto kept_total = kept.sum(dims, true);
  auto emptied = kept_total.le(0).logical_and(total.gt(0));
  kept = torch::where(emptied, weights, kept);
  return kept * (total / torch::where(emptied, total, kept_total).clamp_min(kEps));
}

at::Tensor gated_attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_padding,
                                   const GatedAttentionOptions& options) {
  check_qk(q, k, key_padding, options);
  auto visible = gated_attention_visibility(key_padding, options.causal);
  return topk_attention_dropout(plain_weights(q, k, key_padding, visible, options.form), visible, options.topk,
                                options.topk_dropout, options.training, /*per_row=*/options.causal);
}

namespace {

void check_gated_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_padding,
                      const GatedAttentionOptions& options) {
  check_qk(q, k, key_padding, options);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
  TORCH_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == H && v.size(2) == L && v.scalar_type() == q.scalar_type(),
              "v must be [B, H, L, e] with [B, H, L] = [", B, ", ", H, ", ", L, "] of q's dtype ", q.scalar_type(),
              "; got ", v.sizes(), " ", v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device() && key_padding.device() == q.device(),
              "q, k, v and key_padding must be on one device; got ", q.device(), ", ", k.device(), ", ", v.device(),
              ", ", key_padding.device());
}

// gated_attention_reference on checked arguments.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& key_padding, const GatedAttentionOptions& options) {
  const int64_t B = q.size(0), L = q.size(2);
  if (options.form == GatedAttentionForm::kCosine &&
      !topk_dropout_active(options.topk, options.topk_dropout, options.training))
    return cosine_linear(q, k, v, key_padding, options.causal);
  auto weights = gated_attention_weights(q, k, key_padding, options);
  return ops::matmul(weights, v).masked_fill(key_padding.view({B, 1, L, 1}), 0.0);
}

}  // namespace

at::Tensor gated_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& key_padding, const GatedAttentionOptions& options) {
  check_gated_args(q, k, v, key_padding, options);
  if (gated_attention_fused_takes(q, v, options)) return gated_attention_fused(q, k, v, key_padding, options);
  return reference_attention(q, k, v, key_padding, options);
}

at::Tensor gated_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_padding, const GatedAttentionOptions& options) {
  check_gated_args(q, k, v, key_padding, options);
  return reference_attention(q, k, v, key_padding, options);
}

at::Tensor gated_attention_by_length(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_padding, const GatedAttentionOptions& o,
                                     int64_t groups) {
  check_qk(q, k, key_padding, o);
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(2) == q.size(2), "v must be [B, H, L, e] like q ",
              q.sizes(), "; got ", v.sizes());
  const int64_t B = q.size(0), L = q.size(2);
  // The fused kernel skips padded slots by itself, and runs whole batches.
  if (groups <= 1 || B <= 1 || L == 0 || gated_attention_fused_takes(q, v, o))
    return gated_attention(q, k, v, key_padding, o);
  auto lengths = key_padding.logical_not().sum(1);  // [B]
  // Left padding: each row's real slots are its last `length` ones.
  auto slot = torch::arange(L, lengths.options()).unsqueeze(0);
  if (!key_padding.eq(slot < (L - lengths).unsqueeze(1)).all().item<bool>())
    return gated_attention(q, k, v, key_padding, o);
  const auto cut = slice_by_length(lengths, groups);
  if (cut.shortest == L) return gated_attention(q, k, v, key_padding, o);
  // One gather of the rows in slice order and one split (their backwards: one scatter and one
  // concatenation), rather than a gather per slice, whose backward would fill a whole-batch
  // gradient for every slice.
  std::vector<int64_t> sizes;
  for (const auto& slice : cut.slices) sizes.push_back(slice.rows.size(0));
  const auto rows = cut.order.narrow(0, 0, cut.covered);
  auto split = [&](const at::Tensor& t) { return t.index_select(0, rows).split_with_sizes(sizes, 0); };
  const auto qs = split(q), ks = split(k), vs = split(v), pads = split(key_padding);
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < cut.slices.size(); ++i) {
    const int64_t width = cut.slices[i].width;
    auto cols = [&](const at::Tensor& t, int64_t dim) { return t.narrow(dim, L - width, width); };
    auto out = gated_attention(cols(qs[i], 2), cols(ks[i], 2), cols(vs[i], 2), cols(pads[i], 1), o);
    parts.push_back(width == L ? out : torch::constant_pad_nd(out, {0, 0, L - width, 0}));
  }
  if (cut.covered < B) parts.push_back(torch::zeros({B - cut.covered, v.size(1), L, v.size(3)}, v.options()));
  return torch::cat(parts, 0).index_select(0, inverse_order(cut.order));
}

}  // namespace seqrec::ops
