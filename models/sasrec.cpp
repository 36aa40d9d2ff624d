// SASRec (Kang & McAuley 2018): causal softmax multi-head self-attention on the shared
// backbone (models/backbone.cpp: sqrt(d)-scaled item embedding + learned positions, pre-LN or
// post-LN blocks with a point-wise FFN, final LayerNorm, scores against the item table).
#include <cmath>
#include <limits>

#include "models/backbone.h"
#include "ops/dropout/dropout.h"
#include "ops/products.h"
#include "ops/softmax_attention/softmax_attention.h"

namespace seqrec::models {
namespace {

class SoftmaxAttentionImpl : public AttentionModuleImpl {
 public:
  SoftmaxAttentionImpl(int64_t d, int64_t heads, double dropout) : heads_(heads), dropout_(dropout) {
    // Q, K and V come from one [d, 3d] projection: one GEMM instead of three narrow ones.
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    out_ = register_module("out", torch::nn::Linear(d, d));
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    return apply_linear(out_, attend(apply_linear(qkv_, x), ctx)).view(x.sizes());
  }

  // Every slice's projections as one product over all slots; attention within each slice.
  at::Tensor forward_slices(const at::Tensor& x, SliceLayout& layout) override {
    auto qkv = layout.split(apply_linear(qkv_, x));  // [b_s, L_s, 3D] each
    return apply_linear(out_, layout.each([&](size_t s) { return attend(qkv[s], layout.ctx[s]); }));
  }

  // Output at the last slot only: the query of slot L-1 against every key (the same set
  // whether attention is causal or bidirectional). Under left padding the last slot is real
  // whenever the row has any item, so only key padding applies. In training its attention
  // probabilities take dropout as the full op's do (the last-slot objective trains through it).
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) override {
    // Keys and values for every slot, the query for the last one only.
    auto p = project_for_last_slot(qkv_, x);
    return apply_linear(out_, attend_last(p.query, p.keys_values, ctx));
  }

  at::Tensor forward_last_slices(const at::Tensor& x, SliceLayout& layout) override {
    auto p = project_for_last_slot(qkv_, x.index_select(0, layout.last_slots), x);
    auto q = layout.split_rows(p.query);
    auto kv = layout.split(p.keys_values);
    return apply_linear(out_, layout.each([&](size_t s) { return attend_last(q[s], kv[s], layout.ctx[s]); }));
  }

 private:
  // qkv [B, L, 3·D], the packed projection -> the heads' outputs [B·L, D] before the output projection.
  at::Tensor attend(const at::Tensor& qkv, AttentionContext& ctx) {
    const int64_t B = qkv.size(0), L = qkv.size(1), D = qkv.size(2) / 3, dh = D / heads_;
    // [B, L, 3, H, dh] -> three [B, H, L, dh] views; unbind's backward stacks the three
    // gradients into one tensor (three selects would each zero-fill a [3, B, H, L, dh] one).
    auto h = qkv.view({B, L, 3, heads_, dh}).permute({2, 0, 3, 1, 4}).unbind(0);
    if (!ctx.bias.defined())
      ctx.bias = ctx.causal ? ops::causal_padding_bias(ctx.key_padding, qkv.scalar_type())
                            : ops::padding_bias(ctx.key_padding, qkv.scalar_type());
    auto o = ops::causal_softmax_attention_biased(h[0], h[1], h[2], ctx.bias, dropout_, is_training());
    return o.transpose(1, 2).reshape({B * L, D});
  }

  // query [B, D] of the last slot, keys_values [B, L, 2·D] -> [B, D] before the output projection.
  at::Tensor attend_last(const at::Tensor& query, const at::Tensor& keys_values, AttentionContext& ctx) {
    const int64_t B = keys_values.size(0), L = keys_values.size(1), D = query.size(1), dh = D / heads_;
    auto kv = keys_values.view({B, L, 2, heads_, dh}).permute({2, 0, 3, 1, 4}).unbind(0);  // 2 x [B, H, L, dh]
    auto q = query.view({B, heads_, 1, dh});
    auto k = kv[0], v = kv[1];
    auto scores = ops::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(dh)));
    // Padded keys are masked; the last slot itself always stays visible (as in the full op).
    auto masked = ctx.key_padding.clone();
    masked.select(1, L - 1).fill_(false);
    scores.masked_fill_(masked.view({B, 1, 1, L}), -std::numeric_limits<float>::infinity());
    auto o = ops::matmul(ops::dropout(torch::softmax(scores, -1), dropout_, is_training()), v);  // [B, H, 1, dh]
    return o.reshape({B, D});
  }

  int64_t heads_;
  double dropout_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr};
};

}  // namespace

std::shared_ptr<AttentionModuleImpl> make_softmax_attention(const ModelOptions& o) {
  return std::make_shared<SoftmaxAttentionImpl>(o.hidden, o.heads, o.dropout);
}

std::unique_ptr<SequenceModel> make_sasrec(const ModelOptions& o) {
  BackboneSpec spec;
  spec.attention = [o](int64_t) { return make_softmax_attention(o); };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
