// LightSANs (Fan et al., SIGIR'21): low-rank decomposed self-attention. Keys and values are
// aggregated into k latent interests (softmax over positions of x·Θ, one Θ each for keys and
// values per layer); each query attends its k interests. Positions enter either through the
// decoupled branch (softmax(P_Q P_Kᵀ) over the raw values, P = LayerNorm(position table), scaled
// 1/(sqrt(2)·d_h) as in the released code; no dropout on it) or, for LightSANs-ape, added at the
// input as in SASRec. Causal throughout (ops/interest_attention), so it trains SASRec-style.
#include <cmath>

#include "models/backbone.h"
#include "ops/interest_attention/interest_attention.h"
#include "ops/products.h"
#include "ops/softmax_attention/softmax_attention.h"

namespace seqrec::models {
namespace {

class LightSansAttentionImpl : public AttentionModuleImpl {
 public:
  LightSansAttentionImpl(const ModelOptions& o)
      : heads_(o.heads), dropout_(o.dropout), decoupled_(o.lightsans_position == "decoupled") {
    qkv_ = register_module("qkv", torch::nn::Linear(o.hidden, 3 * o.hidden));
    out_ = register_module("out", torch::nn::Linear(o.hidden, o.hidden));
    theta_k_ = register_parameter("theta_k", torch::empty({o.hidden, o.interests}));
    theta_v_ = register_parameter("theta_v", torch::empty({o.hidden, o.interests}));
    if (decoupled_) {
      pos_ln_ = register_module(
          "pos_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)));
      pos_q_ = register_module("pos_q", torch::nn::Linear(o.hidden, o.hidden));
      pos_k_ = register_module("pos_k", torch::nn::Linear(o.hidden, o.hidden));
    }
  }

  // Θ starts N(0, 1), as in the released code (its initialiser leaves Θ alone).
  void initialise(at::Generator& gen) override {
    torch::NoGradGuard no_grad;
    theta_k_.copy_(at::normal(0.0, 1.0, theta_k_.sizes(), gen, theta_k_.options()));
    theta_v_.copy_(at::normal(0.0, 1.0, theta_v_.sizes(), gen, theta_v_.options()));
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2), dh = D / heads_;
    auto qkv = apply_linear(qkv_, x).chunk(3, -1);  // 3 x [B, L, D]
    const auto& k = qkv[1];
    const auto& v = qkv[2];
    auto heads = [&](const at::Tensor& t) { return t.reshape({t.size(0), t.size(1), heads_, dh}).transpose(1, 2); };
    auto o = ops::causal_interest_attention(heads(qkv[0]), k, v, ops::matmul(k, theta_k_), ops::matmul(v, theta_v_),
                                            ctx.key_padding, dropout_, is_training());  // [B, H, L, dh]
    if (decoupled_) {
      auto p = pos_ln_(ctx.positions).unsqueeze(0);  // [1, L, D], shared by the batch
      // The op scales by 1/sqrt(dh); the released code's total is 1/(sqrt(2)·dh).
      // Shared by the batch ([1, H, L, dh]): the op computes these scores once for all sequences.
      auto pq = heads(apply_linear(pos_q_, p)).mul(1.0 / std::sqrt(2.0 * dh));
      auto pk = heads(apply_linear(pos_k_, p));
      if (!ctx.bias.defined()) ctx.bias = ops::causal_padding_bias(ctx.key_padding, x.scalar_type());
      o = o + ops::causal_softmax_attention_biased(pq, pk, heads(v), ctx.bias, 0.0, is_training());
    }
    return apply_linear(out_, o.transpose(1, 2).reshape({B, L, D}));
  }

 private:
  int64_t heads_;
  double dropout_;
  bool decoupled_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr}, pos_q_{nullptr}, pos_k_{nullptr};
  torch::nn::LayerNorm pos_ln_{nullptr};
  at::Tensor theta_k_, theta_v_;
};

}  // namespace

std::unique_ptr<SequenceModel> make_lightsans(const ModelOptions& o) {
  BackboneSpec spec;
  spec.positions_at_input = o.lightsans_position == "absolute";
  spec.attention = [o](int64_t) { return std::make_shared<LightSansAttentionImpl>(o); };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
