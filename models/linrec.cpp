// LinRec (Liu et al., SIGIR'23): the backbone's softmax attention replaced by ELU + L2-normalised
// linear attention, (KᵀV) first: O(L·d²) per layer. Trained SASRec-style (the causal objective)
// every block uses the causal prefix-sum form, whose last slot equals the paper's global form over
// the whole sequence; under the last-slot objective (each example a prefix scored at its last
// slot, as the released code trains) and the cloze objective every block uses the global form.
// At --matmul_precision medium the attention sits between two bfloat16 products: it takes the
// query/key/value product before its bias and returns bfloat16 for the output projection
// (ops::linrec_attention_packed_bf16 and _last_bf16), so no float32 copy of either is made.
#include <cmath>

#include "models/backbone.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/products.h"

namespace seqrec::models {
namespace {

class LinrecAttentionImpl : public AttentionModuleImpl {
 public:
  LinrecAttentionImpl(int64_t d, int64_t heads, ops::LinrecNorm norm) : heads_(heads), norm_(norm) {
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    out_ = register_module("out", torch::nn::Linear(d, d));
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    return attend(x, ctx, ctx.causal ? ops::LinrecForm::kCausal : ops::LinrecForm::kGlobal);
  }

  // The last slot sees every real key in either form: the global form gives it without the
  // per-chunk prefix work, and only its own query is projected and normalised.
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) override {
    if (ops::bf16_products(x)) {
      auto p = last_slot_products_bf16(qkv_, x);
      return apply_linear(out_, ops::linrec_attention_last_bf16(p.query, p.query_bias, p.keys_values,
                                                                p.keys_values_bias, heads_, ctx.key_padding, norm_));
    }
    auto p = project_for_last_slot(qkv_, x);
    return apply_linear(out_, ops::linrec_attention_last(p.query, p.keys_values, heads_, ctx.key_padding, norm_));
  }

 private:
  at::Tensor attend(const at::Tensor& x, AttentionContext& ctx, ops::LinrecForm form) {
    if (ops::bf16_products(x))  // bfloat16 from the projection's product to the output projection's
      return apply_linear(out_, ops::linrec_attention_packed_bf16(ops::product_bf16(x, qkv_->weight), qkv_->bias,
                                                                  heads_, ctx.key_padding, norm_, form));
    return apply_linear(out_, ops::linrec_attention_packed(apply_linear(qkv_, x), heads_, ctx.key_padding, norm_, form));
  }

  int64_t heads_;
  ops::LinrecNorm norm_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr};
};

}  // namespace

std::unique_ptr<SequenceModel> make_linrec(const ModelOptions& o) {
  const auto norm = ops::parse_linrec_norm(o.linrec_norm);
  BackboneSpec spec;
  spec.attention = [o, norm](int64_t) { return std::make_shared<LinrecAttentionImpl>(o.hidden, o.heads, norm); };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
