#include "ops/softmax_attention/softmax_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/products.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace seqrec::ops {

namespace {

// allowed[b, i, j] = (j <= i or bidirectional) && !pad[b, j], plus the diagonal so no row is empty.
at::Tensor attention_bias(const at::Tensor& key_padding, at::ScalarType dtype, bool causal) {
  TORCH_CHECK(key_padding.dim() == 2, "key_padding must be [B, L], got ", key_padding.sizes());
  TORCH_CHECK(key_padding.scalar_type() == at::kBool, "key_padding must be bool");
  const int64_t L = key_padding.size(1);
  auto opts = key_padding.options().dtype(at::kBool);
  auto allowed = key_padding.logical_not().unsqueeze(1).expand({key_padding.size(0), L, L});
  if (causal) allowed = allowed & torch::ones({L, L}, opts).tril().unsqueeze(0);
  allowed = allowed | torch::eye(L, opts).unsqueeze(0);
  auto bias = torch::zeros(allowed.sizes(), key_padding.options().dtype(dtype));
  bias.masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return bias.unsqueeze(1);
}

}  // namespace

at::Tensor causal_padding_bias(const at::Tensor& key_padding, at::ScalarType dtype) {
  return attention_bias(key_padding, dtype, /*causal=*/true);
}

at::Tensor padding_bias(const at::Tensor& key_padding, at::ScalarType dtype) {
  return attention_bias(key_padding, dtype, /*causal=*/false);
}

at::Tensor causal_softmax_attention_biased(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& bias,
                                           double dropout, bool training) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 &&
                  v.sizes().slice(1) == q.sizes().slice(1) && (v.size(0) == q.size(0) || q.size(0) == 1),
              "q, k, v must be [B, H, L, Dh] of one shape (q and k may be [1, H, L, Dh], shared by "
              "the batch); got q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes());
  TORCH_CHECK(bias.dim() == 4 && bias.size(2) == q.size(2) && bias.size(3) == q.size(2) &&
                  (bias.size(0) == v.size(0) || bias.size(0) == 1),
              "bias must be [B or 1, 1, L, L]; got ", bias.sizes(), " for v ", v.sizes());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const int64_t B = v.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  const bool shared = q.size(0) == 1 && B > 1;
  at::Tensor scores;
  if (bf16_products(q)) {
    // Products on bfloat16 operands: the scores stay bfloat16, and one pass per row scales,
    // masks, normalises and drops them into the bfloat16 operand of the product with v.
    auto s = at::matmul(product_operand(q), product_operand(k).transpose(-2, -1));
    if (shared) s = s.expand({B, H, L, L}).contiguous();
    auto probs = ops::softmax_dropout_bf16(s, bias.to(at::kFloat), scale, dropout, training);
    return at::matmul(probs, product_operand(v)).to(q.scalar_type());
  } else if (shared) {
    // Scores shared by the batch (the positions-only scores of LightSANs' decoupled branch): one
    // L x L product, broadcast over the batch by the mask; backward sums the batch's score
    // gradients once before the product's two, where per-sequence copies cost B of each.
    scores = ops::matmul(q, k.transpose(-2, -1)).mul_(scale) + bias;
  } else if (H == 1 && bias.size(0) == B) {
    // One GEMM call adds the mask and applies the scale: bias + scale * q k^T.
    scores = torch::baddbmm(bias.view({B, L, L}), q.reshape({B, L, D}), k.reshape({B, L, D}).transpose(1, 2), 1.0, scale)
                 .view({B, 1, L, L});
  } else {
    scores = ops::matmul(q, k.transpose(-2, -1)).mul_(scale).add_(bias);
  }
  auto probs = torch::softmax(scores, -1);
  probs = ops::dropout(probs, dropout, training);
  return ops::matmul(probs, v);
}

at::Tensor causal_softmax_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& key_padding, double dropout, bool training) {
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.size(0) == q.size(0) &&
                  key_padding.size(1) == q.size(2),
              "key_padding must be [B, L] matching q; got ", key_padding.sizes(), " for q ",
              q.sizes());
  return causal_softmax_attention_biased(q, k, v, causal_padding_bias(key_padding, q.scalar_type()),
                                         dropout, training);
}

}  // namespace seqrec::ops
