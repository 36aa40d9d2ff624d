// LinRec (Liu et al., SIGIR'23): the backbone's softmax attention replaced by ELU + L2-normalised
// linear attention, (KᵀV) first: O(L·d²) per layer. Trained SASRec-style (the causal objective)
// every block uses the causal prefix-sum form, whose last slot equals the paper's global form over
// the whole sequence; under the last-slot objective (each example a prefix scored at its last
// slot, as the released code trains) and the cloze objective every block uses the global form.
// At --matmul_precision medium the attention sits between two bfloat16 products: it takes the
// query/key/value product before its bias and returns bfloat16 for the output projection
// (ops::linrec_attention_packed_bf16 and _last_bf16), so no float32 copy of either is made.
// With --linrec_pad_keys a row's padded slots are keys and values too, as in the released code,
// which applies no mask: a padded slot holds zeros, so its key and value are the projection of
// what the block's attention reads there (AttentionContext::padded_input), and a row of n items
// has max_len - n of them whatever width its batch was trimmed to, which keeps the trainer's
// length slices exact. Copies of one key and value are one rank-one term of the attention's
// sums (ops::LinrecPadKeys), so the op takes them as one key, one value and a count per row, and
// they cost the same whatever their number.
#include <algorithm>
#include <cmath>

#include "models/backbone.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/products.h"

namespace seqrec::models {
namespace {

class LinrecAttentionImpl : public AttentionModuleImpl {
 public:
  LinrecAttentionImpl(int64_t d, int64_t heads, ops::LinrecNorm norm, bool pad_keys, int64_t max_len)
      : heads_(heads), norm_(norm), pad_keys_(pad_keys), max_len_(max_len) {
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    out_ = register_module("out", torch::nn::Linear(d, d));
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    auto p = project(x);
    return apply_linear(out_, attend(p, ctx, padded_keys_values(ctx, bf16_attention(p)))).view(x.sizes());
  }

  // Every slice's projections as one product over all slots; attention within each slice. The
  // padded slots' key and value are the same in every slice, so they are projected once.
  at::Tensor forward_slices(const at::Tensor& x, SliceLayout& layout) override {
    auto all = project(x);
    const auto pad_kv = padded_keys_values(layout.ctx.front(), bf16_attention(all));
    auto p = layout.split(all);
    return apply_linear(out_, layout.each([&](size_t s) { return attend(p[s], layout.ctx[s], pad_kv); }));
  }

  // The last slot sees every real key in either form: the global form gives it without the
  // per-chunk prefix work, and only its own query is projected and normalised.
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) override {
    return forward_last(x.select(1, x.size(1) - 1), x, ctx, [&](const at::Tensor& q, const at::Tensor& kv, auto&& op) {
      return op(q, kv, ctx.key_padding);
    });
  }

  at::Tensor forward_last_slices(const at::Tensor& x, SliceLayout& layout) override {
    return forward_last(x.index_select(0, layout.last_slots), x, layout.ctx.front(),
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

  // Whether project() gave a bfloat16 product before its bias (the op then adds the bias).
  bool bf16_attention(const at::Tensor& p) const {
    return p.scalar_type() == at::kBFloat16 && qkv_->bias.scalar_type() != at::kBFloat16;
  }

  // p [B, L, 3·D] from project() -> [B·L, D] before the output projection (bfloat16 from a
  // bfloat16 product, so the output projection reads it as it is); pad_kv from
  // padded_keys_values().
  at::Tensor attend(const at::Tensor& p, AttentionContext& ctx, const at::Tensor& pad_kv) {
    const auto form = ctx.causal ? ops::LinrecForm::kCausal : ops::LinrecForm::kGlobal;
    const bool bf16 = bf16_attention(p);
    const auto pad = pad_keys(pad_kv, ctx.key_padding);
    auto o = bf16 ? ops::linrec_attention_packed_bf16(p, qkv_->bias, heads_, ctx.key_padding, norm_, form, pad)
                  : ops::linrec_attention_packed(p, heads_, ctx.key_padding, norm_, form, pad);
    return o.reshape({-1, o.size(-1)});
  }

  // --linrec_pad_keys: a padded slot's keys and values [2·D], the projection of what attention
  // reads there, as the op takes them (float32 from a bfloat16 product and its bias where the
  // rows' products are bfloat16); undefined without the flag.
  at::Tensor padded_keys_values(const AttentionContext& ctx, bool bf16) {
    if (!pad_keys_) return {};
    const int64_t d = qkv_->weight.size(1);
    auto in = ctx.padded_input.defined() ? ctx.padded_input : torch::zeros({d}, qkv_->weight.options());
    in = in.to(qkv_->weight.scalar_type()).view({1, d});
    auto qkv = bf16 ? ops::product_bf16(in, qkv_->weight).to(at::kFloat) + qkv_->bias : apply_linear(qkv_, in);
    return qkv.view({-1}).narrow(0, d, 2 * d);
  }

  // The pad keys of rows with key padding `pad` [b, L]: each row has max(max_len, L) - n padded
  // slots for its n items, the ones its batch was trimmed of included.
  ops::LinrecPadKeys pad_keys(const at::Tensor& kv, const at::Tensor& pad) const {
    if (!kv.defined()) return {};
    auto count = std::max(max_len_, pad.size(1)) - pad.logical_not().sum(1);
    return ops::linrec_pad_keys_packed(kv, heads_, count);
  }

  // The last slots' outputs from their rows `last` [R, D] and every slot `all`: split(q, kv, op)
  // applies op(query rows, keys/values [b, L, 2·D], key padding [b, L]) to each slice of them.
  // `ctx` gives the padded slots' input (every slice's is the same).
  template <class Split>
  at::Tensor forward_last(const at::Tensor& last, const at::Tensor& all, const AttentionContext& ctx,
                          Split&& split) {
    const bool bf16 = ops::bf16_products(all);
    const auto pad_kv = padded_keys_values(ctx, bf16);
    if (bf16) {
      auto p = last_slot_products_bf16(qkv_, last, all);
      return apply_linear(out_, split(p.query, p.keys_values, [&](const at::Tensor& q, const at::Tensor& kv,
                                                                   const at::Tensor& pad) {
        return ops::linrec_attention_last_bf16(q, p.query_bias, kv, p.keys_values_bias, heads_, pad, norm_,
                                               pad_keys(pad_kv, pad));
      }));
    }
    auto p = project_for_last_slot(qkv_, last, all);
    return apply_linear(out_, split(p.query, p.keys_values, [&](const at::Tensor& q, const at::Tensor& kv,
                                                                 const at::Tensor& pad) {
      return ops::linrec_attention_last(q, kv, heads_, pad, norm_, pad_keys(pad_kv, pad));
    }));
  }

  int64_t heads_;
  ops::LinrecNorm norm_;
  bool pad_keys_;
  int64_t max_len_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr};
};

}  // namespace

std::unique_ptr<SequenceModel> make_linrec(const ModelOptions& o) {
  const auto norm = ops::parse_linrec_norm(o.linrec_norm);
  BackboneSpec spec;
  spec.attention = [o, norm](int64_t) {
    return std::make_shared<LinrecAttentionImpl>(o.hidden, o.heads, norm, o.linrec_pad_keys, o.max_len);
  };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
