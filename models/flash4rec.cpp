// FLASH4Rec (Yan & Li, 2023 slides) on the shared backbone: each block is a gated attention
// layer (FLASH's gated attention unit, Hua et al. 2022, with the slides' user-aware gate)
// followed by a sparsely-gated mixture-of-experts feed-forward layer (models/moe.h).
//
// Gated attention unit, per block (x [B, L, D], e = expansion x D, s = the query/key width):
//   Z = silu(x W_z) [B, L, s],  V = silu(x W_v) [B, L, e]              (slide Eqs. 1-2)
//   U = silu([x, u] W_u) [B, L, e], u = the row's user vector           (Eq. 3, user-aware gate)
//   q = Z * gamma_q + beta_q,  k = Z * gamma_k + beta_k                 (FLASH's per-dimension scale/offset)
//   A = softmax(q k^T / sqrt(s)) or (1 + cos(q, k)) / row sum          (Eqs. 4-5, ops/gated_attention)
//   out = (U * A V) W_o, then dropout                                   (Eq. 6 + FLASH's output projection)
// The slides leave the activation unnamed (SiLU as in FLASH), give no output projection and no
// normaliser for the 1 + cos form (the row sum keeps A an average); Top-K attention dropout
// (Eqs. 7-9, corrected rescale) runs on A in training. The user vector u comes from the
// dataset's categorical features (a sum of one embedding per feature), a learned per-user
// embedding, or a zero vector; with --flash_user none the gate reads the item alone (FLASH's
// U = silu(x W_u)), the "without user gate" ablation. --flash_unit mhsa replaces the unit with
// SASRec's multi-head softmax attention ("without gated attention"), --moe_experts 0 the mixture
// with the dense FFN ("without MoE"), --topk_dropout 0 drops Top-K dropout.
// In training, expert capacity couples the tokens of a batch (a token may be dropped because
// others, later slots included, took its expert's slots), as in every capacity-based MoE; the
// priority that decides it is a hash of (user, slot), and evaluation is dropless and so exactly
// causal.
#include <cmath>

#include "models/backbone.h"
#include "models/moe.h"
#include "ops/dropout/dropout.h"
#include "ops/gated_attention/gated_attention.h"

namespace seqrec::models {
namespace {

// Width of the gate's value and the query/key base.
int64_t expanded(const ModelOptions& o) { return o.flash_expansion * o.hidden; }
int64_t qk_width(const ModelOptions& o) {
  return o.flash_qk_dim > 0 ? o.flash_qk_dim : std::min<int64_t>(128, expanded(o));
}

// The user vector of each row, [B, D].
class UserVectorImpl : public UserEncoderImpl {
 public:
  explicit UserVectorImpl(const ModelOptions& o) : mode_(o.flash_user), dim_(o.hidden) {
    if (mode_ == "features") {
      for (size_t f = 0; f < o.user_feature_cardinalities.size(); ++f)
        features_.push_back(register_module("feature" + std::to_string(f),
                                            torch::nn::Embedding(o.user_feature_cardinalities[f] + 1, o.hidden)));
    } else if (mode_ == "embedding") {
      users_ = register_module("user_emb", torch::nn::Embedding(o.num_users, o.hidden));
    }
  }

  at::Tensor forward(const UserInput& users, int64_t batch, const at::Device& device) override {
    auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    if (mode_ == "features") {
      TORCH_CHECK(users.features.defined() && users.features.size(0) == batch &&
                      users.features.size(1) == static_cast<int64_t>(features_.size()),
                  "flash4rec: the batch carries no user features of ", features_.size(), " columns");
      at::Tensor sum;
      for (size_t f = 0; f < features_.size(); ++f) {
        auto e = features_[f](users.features.select(1, static_cast<int64_t>(f)));  // code 0 = unknown
        sum = sum.defined() ? sum + e : e;
      }
      return sum;
    }
    if (mode_ == "embedding") {
      TORCH_CHECK(users.ids.defined() && users.ids.size(0) == batch, "flash4rec: the batch carries no user ids");
      return users_(users.ids);
    }
    return torch::zeros({batch, dim_}, options);
  }

 private:
  std::string mode_;
  int64_t dim_;
  std::vector<torch::nn::Embedding> features_;
  torch::nn::Embedding users_{nullptr};
};

class GatedAttentionUnitImpl : public AttentionModuleImpl {
 public:
  GatedAttentionUnitImpl(const ModelOptions& o, int64_t length_groups)
      : e_(expanded(o)), s_(qk_width(o)), user_gate_(o.flash_user != "none"), dropout_(o.dropout),
        length_groups_(length_groups) {
    options_.form = ops::parse_gated_attention_form(o.flash_attention);
    options_.topk = o.topk_dropout_k;
    options_.topk_dropout = o.topk_dropout;
    // Z and V from one GEMM; the gate reads the item and, when user-aware, the user vector.
    zv_ = register_module("zv", torch::nn::Linear(o.hidden, s_ + e_));
    gate_ = register_module("gate", torch::nn::Linear(o.hidden * (user_gate_ ? 2 : 1), e_));
    out_ = register_module("out", torch::nn::Linear(e_, o.hidden));
    gamma_ = register_parameter("gamma", torch::ones({2, s_}));
    beta_ = register_parameter("beta", torch::zeros({2, s_}));
  }

  // FLASH's scale/offset initialisation: gamma ~ N(0, 0.02), beta = 0.
  void initialise(at::Generator& gen) override {
    torch::NoGradGuard no_grad;
    gamma_.copy_(at::normal(0.0, 0.02, gamma_.sizes(), gen, gamma_.options()));
    beta_.zero_();
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    const int64_t B = x.size(0), L = x.size(1);
    auto zv = torch::silu(apply_linear(zv_, x));
    auto z = zv.narrow(-1, 0, s_), v = zv.narrow(-1, s_, e_);
    at::Tensor gate_in = x;
    if (user_gate_) {
      TORCH_CHECK(ctx.user.defined(), "flash4rec: the user-aware gate needs the rows' user vectors");
      gate_in = torch::cat({x, ctx.user.unsqueeze(1).expand({B, L, ctx.user.size(-1)})}, -1);
    }
    auto u = torch::silu(apply_linear(gate_, gate_in));
    auto q = (z * gamma_[0] + beta_[0]).unsqueeze(1);  // one head: [B, 1, L, s]
    auto k = (z * gamma_[1] + beta_[1]).unsqueeze(1);
    auto o = options_;
    o.causal = ctx.causal;
    o.training = is_training();
    auto av = ops::gated_attention_by_length(q, k, v.unsqueeze(1), ctx.key_padding, o, length_groups_).squeeze(1);  // [B, L, e]
    return ops::dropout(apply_linear(out_, u * av), dropout_, is_training());
  }

 private:
  int64_t e_, s_;
  bool user_gate_;
  double dropout_;
  int64_t length_groups_;
  ops::GatedAttentionOptions options_;
  torch::nn::Linear zv_{nullptr}, gate_{nullptr}, out_{nullptr};
  at::Tensor gamma_, beta_;
};

// Capacity priority of each real token when the rows' users are known (training): a hash of
// (user, slot counted from the right), so that which tokens an expert drops depends on neither
// the number of ranks nor the order of rows in a batch, and no user is favoured by its id.
at::Tensor priority(const at::Tensor& real, const at::Tensor& users) {
  if (!users.defined() || users.size(0) != real.size(0)) return {};
  const int64_t B = real.size(0), L = real.size(1);
  // Host work on host copies (the keys stay on the host: the MoE's slot bookkeeping runs there).
  auto r = real.to(torch::kCPU).contiguous();
  auto keys = torch::empty({r.sum().item<int64_t>()}, torch::kInt64);
  auto* out = keys.data_ptr<int64_t>();
  const auto* mask = r.data_ptr<bool>();
  auto u = users.to(torch::kCPU).to(torch::kInt64).contiguous();
  const auto* id = u.data_ptr<int64_t>();
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < L; ++j)
      if (mask[b * L + j]) {
        const uint64_t z = ops::mix64(static_cast<uint64_t>(id[b]) * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(L - 1 - j));
        out[n++] = static_cast<int64_t>(z >> 1);
      }
  return keys;
}

// The mixture of experts over the real slots of [B, L, D].
class MoeBlockImpl : public FeedForwardModuleImpl {
 public:
  MoeBlockImpl(const ModelOptions& o, const ModelRuntime& runtime, int64_t layer) {
    MoeOptions m;
    m.dim = o.hidden;
    m.inner = o.ffn_inner > 0 ? o.ffn_inner : o.hidden;
    m.experts = o.moe_experts;
    m.top_k = o.moe_top_k;
    m.capacity_factor = o.capacity_factor;
    m.noisy = o.moe_noise;
    m.balance_coef = o.moe_balance;
    m.activation = o.ffn_activation;
    m.dropout = o.dropout;
    m.init_seed = o.init_seed * 1000003ull + static_cast<uint64_t>(layer);  // per layer, any layout
    m.world = runtime.world;
    m.ep = runtime.expert_group;
    moe_ = register_module("experts", MoeFeedForward(m));
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    auto real = ctx.key_padding.logical_not();
    // Evaluation is dropless, so capacity priority matters in training only.
    auto keys = is_training() ? priority(real, ctx.users.ids) : at::Tensor();
    auto y = moe_(x.index({real}), keys);  // [T, D], rows in (batch, slot) order
    return torch::zeros_like(x).index_put({real}, y);
  }
  at::Tensor take_auxiliary_loss() override { return moe_->take_auxiliary_loss(); }
  bool is_expert_parameter(const std::string& key) const override {
    const std::string prefix = "experts.";
    return key.rfind(prefix, 0) == 0 && MoeFeedForwardImpl::expert_of_parameter(key.substr(prefix.size())) >= 0;
  }

 private:
  MoeFeedForward moe_{nullptr};
};

}  // namespace

std::unique_ptr<SequenceModel> make_flash4rec(const ModelOptions& o, const ModelRuntime& runtime) {
  BackboneSpec spec;
  if (o.flash_unit == "mhsa") {
    spec.attention = [o](int64_t) { return make_softmax_attention(o); };
  } else {
    spec.attention = [o, runtime](int64_t) {
      return std::make_shared<GatedAttentionUnitImpl>(o, runtime.attention_length_groups);
    };
    if (o.flash_user != "none") spec.user_encoder = std::make_shared<UserVectorImpl>(o);
  }
  if (o.moe_experts > 0)
    spec.feed_forward = [o, runtime](int64_t layer) { return std::make_shared<MoeBlockImpl>(o, runtime, layer); };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
