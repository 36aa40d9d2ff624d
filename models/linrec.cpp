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
// what the block's attention reads there (AttentionContext::padded_input), and a row of length n
// has max_len - n of them whatever width its batch was trimmed to (the dropped ones are put back
// in front), which keeps the trainer's length slices exact.
#include <cmath>
#include <tuple>
#include <utility>

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

  // p [B, L, 3·D] from project() -> [B·L, D] before the output projection (bfloat16 from a
  // bfloat16 product, so the output projection reads it as it is).
  at::Tensor attend(const at::Tensor& p, AttentionContext& ctx) {
    const auto form = ctx.causal ? ops::LinrecForm::kCausal : ops::LinrecForm::kGlobal;
    const int64_t width = p.size(1);
    at::Tensor full = p, key_padding = ctx.key_padding;
    if (pad_keys_) std::tie(full, key_padding) = with_dropped_slots(project(padded_input(ctx)), p, key_padding);
    auto o = p.scalar_type() == at::kBFloat16 && qkv_->bias.scalar_type() != at::kBFloat16
                 ? ops::linrec_attention_packed_bf16(full, qkv_->bias, heads_, key_padding, norm_, form)
                 : ops::linrec_attention_packed(full, heads_, key_padding, norm_, form);
    if (full.size(1) != width) o = o.narrow(1, full.size(1) - width, width);
    return o.reshape({-1, o.size(-1)});
  }

  // --linrec_pad_keys: what attention reads at a padded slot, as [1, 1, D].
  at::Tensor padded_input(const AttentionContext& ctx) const {
    const int64_t d = qkv_->weight.size(1);
    auto in = ctx.padded_input.defined() ? ctx.padded_input : torch::zeros({d}, qkv_->weight.options());
    return in.to(qkv_->weight.scalar_type()).view({1, 1, d});
  }

  // rows [b, L, W] with the max_len - L slots that trimming dropped put back in front, each
  // `slot` [1, 1, W] (a padded slot's projection), and a key padding [b, max_len] (like `pad`)
  // that masks none of them.
  std::pair<at::Tensor, at::Tensor> with_dropped_slots(const at::Tensor& slot, const at::Tensor& rows,
                                                       const at::Tensor& pad) const {
    const int64_t dropped = max_len_ - rows.size(1);
    auto full = dropped <= 0 ? rows
                             : torch::cat({slot.to(rows.scalar_type()).expand({rows.size(0), dropped, rows.size(2)}),
                                           rows}, 1);
    return {full, torch::zeros({rows.size(0), full.size(1)}, pad.options())};
  }

  // The last slots' outputs from their rows `last` [R, D] and every slot `all`: split(q, kv, op)
  // applies op(query rows, keys/values [b, L, 2·D], key padding [b, L]) to each slice of them.
  // `ctx` gives the padded slots' input (every slice's is the same).
  template <class Split>
  at::Tensor forward_last(const at::Tensor& last, const at::Tensor& all, const AttentionContext& ctx,
                          Split&& split) {
    // --linrec_pad_keys: the slice's keys and values with the dropped padded slots in front, and
    // no key masked; otherwise as they are.
    auto keys = [&](const at::Tensor& pad_kv, const at::Tensor& kv, const at::Tensor& pad) {
      return pad_keys_ ? with_dropped_slots(pad_kv, kv, pad) : std::make_pair(kv, pad);
    };
    // A padded slot's keys and values [1, 1, 2·D] as `products` gives every slot's.
    auto padded = [&](auto&& products) {
      if (!pad_keys_) return at::Tensor();
      auto in = padded_input(ctx).view({1, -1});
      return products(qkv_, in, in).keys_values.view({1, 1, -1});
    };
    if (ops::bf16_products(all)) {
      auto p = last_slot_products_bf16(qkv_, last, all);
      const auto pad_kv = padded([](auto&&... a) { return last_slot_products_bf16(a...); });
      return apply_linear(out_, split(p.query, p.keys_values, [&](const at::Tensor& q, const at::Tensor& kv,
                                                                   const at::Tensor& pad) {
        auto [k, kp] = keys(pad_kv, kv, pad);
        return ops::linrec_attention_last_bf16(q, p.query_bias, k, p.keys_values_bias, heads_, kp, norm_);
      }));
    }
    auto p = project_for_last_slot(qkv_, last, all);
    const auto pad_kv = padded([](auto&&... a) { return project_for_last_slot(a...); });
    return apply_linear(out_, split(p.query, p.keys_values, [&](const at::Tensor& q, const at::Tensor& kv,
                                                                 const at::Tensor& pad) {
      auto [k, kp] = keys(pad_kv, kv, pad);
      return ops::linrec_attention_last(q, k, heads_, kp, norm_);
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
