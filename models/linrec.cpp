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
    return apply_linear(out_, attend(project(x), ctx)).view(x.sizes());
  }

  // Every slice's projections as one product over all slots; attention within each slice.
  at::Tensor forward_slices(const at::Tensor& x, SliceLayout& layout) override {
    auto p = layout.split(project(x));
    return apply_linear(out_, layout.each([&](size_t s) { return attend(p[s], layout.ctx[s]); }));
  }

  // The last slot sees every real key in either form: the global form gives it without the
  // per-chunk prefix work, and only its own query is projected and normalised.
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) override {
    return forward_last(x.select(1, x.size(1) - 1), x, [&](const at::Tensor& q, const at::Tensor& kv, auto&& op) {
      return op(q, kv, ctx.key_padding);
    });
  }

  at::Tensor forward_last_slices(const at::Tensor& x, SliceLayout& layout) override {
    return forward_last(x.index_select(0, layout.last_slots), x,
                        [&](const at::Tensor& q, const at::Tensor& kv, auto&& op) {
                          auto qs = layout.split_rows(q);
                          auto kvs = layout.split(kv);
                          return layout.each([&](size_t s) { return op(qs[s], kvs[s], layout.ctx[s].key_padding); });
                        });
  }

 private:
  // The query/key/value projection: at --matmul_precision medium its bfloat16 product before the
  // bias (the attention op adds it as it reads), else the float32 layer.
  at::Tensor project(const at::Tensor& x) {
    return ops::bf16_products(x) ? ops::product_bf16(x, qkv_->weight) : apply_linear(qkv_, x);
  }

  // p [B, L, 3·D] from project() -> [B·L, D] before the output projection (bfloat16 from a
  // bfloat16 product, so the output projection reads it as it is).
  at::Tensor attend(const at::Tensor& p, AttentionContext& ctx) {
    const auto form = ctx.causal ? ops::LinrecForm::kCausal : ops::LinrecForm::kGlobal;
    auto o = p.scalar_type() == at::kBFloat16 && qkv_->bias.scalar_type() != at::kBFloat16
                 ? ops::linrec_attention_packed_bf16(p, qkv_->bias, heads_, ctx.key_padding, norm_, form)
                 : ops::linrec_attention_packed(p, heads_, ctx.key_padding, norm_, form);
    return o.reshape({-1, o.size(-1)});
  }

  // The last slots' outputs from their rows `last` [R, D] and every slot `all`: split(q, kv, op)
  // applies op(query rows, keys/values [b, L, 2·D], key padding [b, L]) to each slice of them.
  template <class Split>
  at::Tensor forward_last(const at::Tensor& last, const at::Tensor& all, Split&& split) {
    if (ops::bf16_products(all)) {
      auto p = last_slot_products_bf16(qkv_, last, all);
      return apply_linear(out_, split(p.query, p.keys_values, [&](const at::Tensor& q, const at::Tensor& kv,
                                                                   const at::Tensor& pad) {
        return ops::linrec_attention_last_bf16(q, p.query_bias, kv, p.keys_values_bias, heads_, pad, norm_);
      }));
    }
    auto p = project_for_last_slot(qkv_, last, all);
    return apply_linear(out_, split(p.query, p.keys_values, [&](const at::Tensor& q, const at::Tensor& kv,
                                                                 const at::Tensor& pad) {
      return ops::linrec_attention_last(q, kv, heads_, pad, norm_);
    }));
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
