#include "models/backbone.h"

#include <cmath>
#include <set>
#include <stdexcept>

#include "ops/dropout/dropout.h"
#include "ops/products.h"
#include "ops/profile_scope.h"

namespace seqrec::models {
namespace {

// Point-wise feed-forward d -> inner -> d (SASRec's two 1x1 convolutions), dropout after each
// layer.
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(const ModelOptions& o) : dropout_(o.dropout), gelu_(o.ffn_activation == "gelu") {
    const int64_t inner = o.ffn_inner > 0 ? o.ffn_inner : o.hidden;
    fc1_ = register_module("fc1", torch::nn::Linear(o.hidden, inner));
    fc2_ = register_module("fc2", torch::nn::Linear(inner, o.hidden));
  }
  at::Tensor forward(const at::Tensor& x) {
    const auto act = gelu_ ? ops::Activation::kGelu : ops::Activation::kRelu;
    if (ops::bf16_products(x)) {
      // Products on bfloat16 operands: each layer's bias, activation and dropout are one pass over
      // its bfloat16 product, and the hidden layer stays in bfloat16 for the second product.
      auto h = ops::bias_activation_dropout(ops::product_bf16(x, fc1_->weight), fc1_->bias, act, dropout_,
                                            is_training(), at::kBFloat16);
      return ops::bias_activation_dropout(ops::product_bf16(h, fc2_->weight), fc2_->bias, std::nullopt, dropout_,
                                          is_training(), at::kFloat);
    }
    auto h = ops::activation_dropout(apply_linear(fc1_, x), act, dropout_, is_training());
    return ops::dropout(apply_linear(fc2_, h), dropout_, is_training());
  }

 private:
  double dropout_;
  bool gelu_;
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(FeedForward);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelOptions& o, std::shared_ptr<AttentionModuleImpl> attention, bool attention_reads_input,
            std::shared_ptr<FeedForwardModuleImpl> feed_forward)
      : norm_first_(o.norm_first) {
    auto ln = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)); };
    if (!norm_first_ || attention_reads_input) attn_ln_ = register_module("attn_ln", ln());
    ffn_ln_ = register_module("ffn_ln", ln());
    attn_ = register_module("attn", std::move(attention));
    if (feed_forward) moe_ = register_module("moe", std::move(feed_forward));
    else ffn_ = register_module("ffn", FeedForward(o));
  }

  at::Tensor forward(at::Tensor x, AttentionContext& ctx) {
    mark_padded_input(ctx);
    if (norm_first_) {
      x = x + attend(attn_ln_ ? attn_ln_(x) : x, ctx);
      return x + position_wise(ffn_ln_(x), ctx);
    }
    x = attn_ln_(x + attend(x, ctx));
    return ffn_ln_(x + position_wise(x, ctx));
  }

  // The block's output at the last slot, [B, D].
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) {
    mark_padded_input(ctx);
    auto last = x.select(1, x.size(1) - 1);
    if (norm_first_) {
      last = last + attn_->forward_last(attn_ln_ ? attn_ln_(x) : x, ctx);
      return last + position_wise_last(ffn_ln_(last), ctx);
    }
    last = attn_ln_(last + attn_->forward_last(x, ctx));
    return ffn_ln_(last + position_wise_last(last, ctx));
  }

  // forward() of every slice of a layout at once, x [N, D]: only attention sees the slices.
  at::Tensor forward_slices(at::Tensor x, SliceLayout& layout) {
    for (auto& c : layout.ctx) mark_padded_input(c);
    if (norm_first_) {
      x = x + attend_slices(attn_ln_ ? attn_ln_(x) : x, layout);
      return x + position_wise_flat(ffn_ln_(x));
    }
    x = attn_ln_(x + attend_slices(x, layout));
    return ffn_ln_(x + position_wise_flat(x));
  }

  // forward_last() of every slice, [Σ b_s, D].
  at::Tensor forward_last_slices(const at::Tensor& x, SliceLayout& layout) {
    for (auto& c : layout.ctx) mark_padded_input(c);
    auto last = x.index_select(0, layout.last_slots);
    if (norm_first_) {
      last = last + attn_->forward_last_slices(attn_ln_ ? attn_ln_(x) : x, layout);
      return last + position_wise_flat(ffn_ln_(last));
    }
    last = attn_ln_(last + attn_->forward_last_slices(x, layout));
    return ffn_ln_(last + position_wise_flat(last));
  }

  AttentionModuleImpl& attention() { return *attn_; }
  FeedForwardModuleImpl* feed_forward() { return moe_.get(); }

 private:
  // Padded slots hold zeros, so attention reads LayerNorm(0) = its bias there under pre-LN, and
  // zeros otherwise.
  void mark_padded_input(AttentionContext& ctx) {
    ctx.padded_input = norm_first_ && attn_ln_ ? attn_ln_->bias : at::Tensor();
  }
  at::Tensor attend(const at::Tensor& x, AttentionContext& ctx) {
    SEQREC_PROFILE_SCOPE("seqrec::attention");
    return attn_->forward(x, ctx);
  }
  at::Tensor position_wise(const at::Tensor& x, AttentionContext& ctx) {
    SEQREC_PROFILE_SCOPE("seqrec::feed_forward");
    return moe_ ? moe_->forward(x, ctx) : ffn_(x);
  }
  at::Tensor attend_slices(const at::Tensor& x, SliceLayout& layout) {
    SEQREC_PROFILE_SCOPE("seqrec::attention");
    return attn_->forward_slices(x, layout);
  }
  // The dense FFN over [N, D] (slices run together only without a mixture of experts).
  at::Tensor position_wise_flat(const at::Tensor& x) {
    SEQREC_PROFILE_SCOPE("seqrec::feed_forward");
    TORCH_CHECK(!moe_, "a mixture-of-experts block runs its batch whole, not as joined slices");
    return ffn_(x);
  }
  // [B, D] at the last slot: a one-slot sequence whose padding is the last slot's.
  at::Tensor position_wise_last(const at::Tensor& last, AttentionContext& ctx) {
    if (!moe_) return ffn_(last);
    AttentionContext one;
    one.key_padding = ctx.key_padding.narrow(1, ctx.key_padding.size(1) - 1, 1);
    return moe_->forward(last.unsqueeze(1), one).squeeze(1);
  }

  bool norm_first_;
  torch::nn::LayerNorm attn_ln_{nullptr}, ffn_ln_{nullptr};
  std::shared_ptr<AttentionModuleImpl> attn_;
  FeedForward ffn_{nullptr};
  std::shared_ptr<FeedForwardModuleImpl> moe_;
};
TORCH_MODULE(Block);

class TransformerRecImpl : public torch::nn::Module {
 public:
  TransformerRecImpl(const ModelOptions& o, const BackboneSpec& spec)
      : o_(o), positions_at_input_(spec.positions_at_input), cloze_(o.objective == "cloze") {
    // The cloze objective's [mask] item is one extra row, never scored.
    items_ = register_module("item_emb", torch::nn::Embedding(o.num_items + 1 + (cloze_ ? 1 : 0), o.hidden));
    positions_ = register_module("pos_emb", torch::nn::Embedding(o.max_len, o.hidden));
    for (int64_t i = 0; i < o.blocks; ++i)
      blocks_.push_back(register_module(
          "block" + std::to_string(i),
          Block(o, spec.attention(i), spec.attention_reads_input, spec.feed_forward ? spec.feed_forward(i) : nullptr)));
    final_ln_ = register_module(
        "final_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)));
    if (spec.input_coder) coder_ = register_module("codes", spec.input_coder);
    if (spec.user_encoder) users_ = register_module("users", spec.user_encoder);
  }

  at::Tensor encode(const at::Tensor& input, const UserInput& users) {
    AttentionContext ctx;
    at::Tensor keep;
    auto x = embed(input, users, ctx, keep);
    for (auto& b : blocks_) x = b->forward(x, ctx) * keep;
    return final_ln_(x) * keep;
  }

  // encode(input)[:, -1]: every block but the last runs on all slots (they feed the last
  // block's keys and values); the last block computes only what the last slot needs. In
  // training the dropout masks differ from encode's but are drawn from the same distribution,
  // except that a mixture of experts would see one slot per row instead of all: its capacity,
  // token dropping and load-balancing loss are defined over every slot, so a model with one
  // in its last block trains through the whole forward.
  at::Tensor encode_last(const at::Tensor& input, const UserInput& users) {
    if (is_training() && blocks_.back()->feed_forward())
      return encode(input, users).select(1, input.size(1) - 1);
    AttentionContext ctx;
    at::Tensor keep;
    auto x = embed(input, users, ctx, keep);
    for (size_t i = 0; i + 1 < blocks_.size(); ++i) x = blocks_[i]->forward(x, ctx) * keep;
    auto keep_last = keep.select(1, input.size(1) - 1);
    auto last = blocks_.back()->forward_last(x, ctx) * keep_last;
    return final_ln_(last) * keep_last;
  }

  // Whether encode_slices() may run length slices together: not with an input coder (LISA's
  // per-slice codes) nor with a mixture of experts (defined over a whole batch).
  bool joins_slices() {
    if (coder_) return false;
    for (auto& b : blocks_)
      if (b->feed_forward()) return false;
    return true;
  }

  // SequenceModel::encode_slices: the embeddings, every position-wise layer and the final
  // LayerNorm run once over the slices' slots laid end to end ([N, D]); attention modules get
  // the layout and attend within each slice.
  at::Tensor encode_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users,
                           bool last_only) {
    SliceLayout layout;
    at::Tensor keep;
    auto x = embed_slices(inputs, users, layout, keep);
    const size_t joined = last_only ? blocks_.size() - 1 : blocks_.size();
    for (size_t i = 0; i < joined; ++i) x = blocks_[i]->forward_slices(x, layout) * keep;
    if (!last_only) return final_ln_(x) * keep;
    auto keep_last = keep.index_select(0, layout.last_slots);
    auto last = blocks_.back()->forward_last_slices(x, layout) * keep_last;
    return final_ln_(last) * keep_last;
  }

  // One online step: the new item's hidden state from its embedding and the coder's state.
  at::Tensor online_step(int64_t item, at::Tensor& state) {
    TORCH_CHECK(!is_training(), "online sessions run in evaluation mode (set_training(false))");
    const auto on = torch::TensorOptions().device(items_->weight.device());
    auto ids = torch::full({1, 1}, item, on.dtype(torch::kLong));
    AttentionContext ctx;
    ctx.key_padding = torch::zeros({1, 1}, on.dtype(torch::kBool));
    ctx.positions = positions_(torch::full({1}, o_.max_len - 1, on.dtype(torch::kLong)));
    auto x = coder_->online_step(items_(ids) * std::sqrt(static_cast<double>(o_.hidden)), state, ctx);
    if (positions_at_input_) x = x + ctx.positions.unsqueeze(0);
    for (size_t i = 0; i + 1 < blocks_.size(); ++i) x = blocks_[i]->forward(x, ctx);
    return final_ln_(blocks_.back()->forward_last(x, ctx)).view(-1);
  }

  at::Tensor item_embeddings() {
    auto table = target_table();
    return coder_ ? coder_->targets(table) : table;
  }
  at::Tensor raw_item_table() { return items_->weight; }
  std::vector<Block>& blocks() { return blocks_; }
  InputCoderImpl* coder() { return coder_.get(); }

 private:
  // The rows that are scored: every item but the cloze objective's [mask].
  at::Tensor target_table() { return cloze_ ? items_->weight.narrow(0, 0, o_.num_items + 1) : items_->weight; }

  at::Tensor embed(const at::Tensor& input, const UserInput& users, AttentionContext& ctx, at::Tensor& keep) {
    TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kLong, "input must be [B, L] int64, got ",
                input.sizes(), " ", input.scalar_type());
    TORCH_CHECK(input.size(1) <= o_.max_len, "input length ", input.size(1), " exceeds max_len ", o_.max_len);
    const int64_t L = input.size(1);
    ctx.key_padding = input.eq(0);
    ctx.causal = !bidirectional(o_);
    ctx.users = users;
    if (users_) ctx.user = users_->forward(users, input.size(0), input.device());
    keep = ctx.key_padding.logical_not().unsqueeze(-1).to(items_->weight.scalar_type());
    // Positions count from the right edge so the most recent item always has the same
    // position whatever the padding (sequences are left-padded).
    ctx.positions = positions_(torch::arange(o_.max_len - L, o_.max_len, input.options()));
    auto x = items_(input) * std::sqrt(static_cast<double>(o_.hidden));
    if (coder_) x = coder_->encode_input(x, input, target_table(), ctx);
    if (positions_at_input_) x = x + ctx.positions.unsqueeze(0);
    return ops::dropout(x, o_.dropout, is_training()) * keep;
  }

  // embed() for every slice at once: x [N, D] and keep [N, 1] over the slices' slots end to end,
  // each slice's context (its padding, users and position rows) in the layout.
  at::Tensor embed_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users,
                          SliceLayout& layout, at::Tensor& keep) {
    check_slices(inputs, users);
    std::vector<at::Tensor> ids, slots, lasts;
    layout.offsets.assign(1, 0);
    for (size_t s = 0; s < inputs.size(); ++s) {
      const auto& input = inputs[s];
      TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kLong, "slice ", s, " must be [B, L] int64, got ",
                  input.sizes(), " ", input.scalar_type());
      const int64_t B = input.size(0), L = input.size(1);
      TORCH_CHECK(L <= o_.max_len, "slice ", s, ": input length ", L, " exceeds max_len ", o_.max_len);
      AttentionContext ctx;
      ctx.key_padding = input.eq(0);
      ctx.causal = !bidirectional(o_);
      if (!users.empty()) ctx.users = users[s];
      if (users_) ctx.user = users_->forward(ctx.users, B, input.device());
      auto slot = torch::arange(o_.max_len - L, o_.max_len, input.options());  // right-aligned, as in embed()
      if (positions_at_input_) slots.push_back(slot.repeat({B}));
      else ctx.positions = positions_(slot);
      ids.push_back(input.reshape({-1}));
      const int64_t start = layout.offsets.back();
      lasts.push_back(torch::arange(1, B + 1, input.options()).mul_(L).add_(start - 1));
      layout.offsets.push_back(start + B * L);
      layout.ctx.push_back(std::move(ctx));
    }
    auto flat = cat_rows(ids);
    layout.last_slots = cat_rows(lasts);
    keep = flat.ne(0).unsqueeze(-1).to(items_->weight.scalar_type());
    auto x = items_(flat) * std::sqrt(static_cast<double>(o_.hidden));
    if (positions_at_input_) x = x + positions_(cat_rows(slots));
    return ops::dropout(x, o_.dropout, is_training()) * keep;
  }

  ModelOptions o_;
  bool positions_at_input_, cloze_;
  torch::nn::Embedding items_{nullptr}, positions_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm final_ln_{nullptr};
  std::shared_ptr<InputCoderImpl> coder_;
  std::shared_ptr<UserEncoderImpl> users_;
};

// Xavier-normal for every matrix, zero biases, LayerNorm (1, 0), then each attention module's
// own initialisation; the padding row is zero.
void initialise(TransformerRecImpl& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Position-wise modules (the mixture of experts) initialise themselves, each expert from its
  // own seed: which experts a rank holds must not shift the shared stream below.
  std::set<const void*> own;
  for (auto& b : m.blocks())
    if (auto* ff = b->feed_forward())
      for (auto& t : ff->parameters()) own.insert(t.unsafeGetTensorImpl());
  for (auto& p : m.named_parameters()) {
    auto& t = p.value();
    if (own.count(t.unsafeGetTensorImpl())) continue;
    const auto& name = p.key();
    if (t.dim() >= 2) {
      const double fan_in = t.size(1), fan_out = t.size(0);
      const double std = std::sqrt(2.0 / (fan_in + fan_out));
      t.copy_(at::normal(0.0, std, t.sizes(), gen, t.options()));
    } else if (name.find("_ln") != std::string::npos && name.size() > 6 &&
               name.compare(name.size() - 6, 6, "weight") == 0) {
      t.fill_(1.0);
    } else {
      t.zero_();
    }
  }
  for (auto& b : m.blocks()) b->attention().initialise(gen);
  if (m.coder()) m.coder()->initialise(gen);
  m.raw_item_table()[0].zero_();
}

class BackboneSession : public OnlineSession {
 public:
  BackboneSession(std::shared_ptr<TransformerRecImpl> net, int64_t num_items)
      : net_(std::move(net)), num_items_(num_items) {}
  at::Tensor push(int64_t item) override {
    if (item < 1 || item > num_items_)
      throw std::out_of_range("online session: item id " + std::to_string(item) + " is outside 1.." +
                              std::to_string(num_items_));
    torch::NoGradGuard no_grad;
    auto h = net_->online_step(item, state_);
    ++length_;
    return h;
  }
  int64_t length() const override { return length_; }

 private:
  std::shared_ptr<TransformerRecImpl> net_;
  int64_t num_items_;
  at::Tensor state_;
  int64_t length_ = 0;
};

class BackboneModel : public SequenceModel {
 public:
  BackboneModel(const ModelOptions& o, const BackboneSpec& spec)
      : o_(o), net_(std::make_shared<TransformerRecImpl>(o, spec)) {
    initialise(*net_, o.init_seed);
  }
  at::Tensor encode(const at::Tensor& input, const UserInput& users = {}) override { return net_->encode(input, users); }
  at::Tensor encode_last(const at::Tensor& input, const UserInput& users = {}) override {
    return net_->encode_last(input, users);
  }
  at::Tensor encode_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users,
                           bool last_only) override {
    if (!net_->joins_slices()) return SequenceModel::encode_slices(inputs, users, last_only);
    return net_->encode_slices(inputs, users, last_only);
  }
  at::Tensor item_embeddings() override { return net_->item_embeddings(); }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (auto& p : net_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (auto& b : net_->named_buffers()) out.emplace_back(b.key(), b.value());
    return out;
  }
  void set_training(bool on) override { net_->train(on); }
  void to(const at::Device& device) override { net_->to(device); }
  at::Device device() override { return net_->raw_item_table().device(); }
  std::vector<std::string> expert_parameters() override {
    std::vector<std::string> out;
    for (size_t i = 0; i < net_->blocks().size(); ++i)
      if (auto* ff = net_->blocks()[i]->feed_forward())
        for (auto& p : ff->named_parameters())
          if (ff->is_expert_parameter(p.key())) out.push_back("block" + std::to_string(i) + ".moe." + p.key());
    return out;
  }
  // The coder's statistics first, then each block's attention's, in a fixed order on
  // every rank.
  std::vector<at::Tensor> pending_statistics() override {
    std::vector<at::Tensor> out;
    if (net_->coder()) out = net_->coder()->pending_statistics();
    for (auto& b : net_->blocks()) {
      auto s = b->attention().pending_statistics();
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }
  void apply_statistics() override {
    if (net_->coder()) net_->coder()->apply_statistics();
    for (auto& b : net_->blocks()) b->attention().apply_statistics();
  }
  std::unique_ptr<OnlineSession> online_session() override {
    if (!net_->coder() || !net_->coder()->supports_online()) return SequenceModel::online_session();  // throws
    return std::make_unique<BackboneSession>(net_, o_.num_items);
  }
  at::Tensor take_auxiliary_loss() override {
    at::Tensor total = net_->coder() ? net_->coder()->take_auxiliary_loss() : at::Tensor();
    for (auto& b : net_->blocks()) {
      for (auto a : {b->attention().take_auxiliary_loss(),
                     b->feed_forward() ? b->feed_forward()->take_auxiliary_loss() : at::Tensor()})
        if (a.defined()) total = total.defined() ? total + a : a;
    }
    return total;
  }
  const ModelOptions& options() const override { return o_; }
  std::string describe_state() override {
    if (!net_->coder()) return {};
    torch::NoGradGuard no_grad;
    const bool was_training = net_->is_training();
    net_->train(false);
    auto line = net_->coder()->describe_state(net_->raw_item_table().narrow(0, 0, o_.num_items + 1));
    net_->train(was_training);
    return line;
  }

 private:
  ModelOptions o_;
  std::shared_ptr<TransformerRecImpl> net_;
};

}  // namespace

at::Tensor apply_linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return ops::linear(x, layer->weight, layer->bias);
}

LastSlotProjection project_for_last_slot(const torch::nn::Linear& qkv, const at::Tensor& last, const at::Tensor& all) {
  const int64_t D = all.size(-1);
  const auto &w = qkv->weight, &b = qkv->bias;
  return {ops::linear(last, w.narrow(0, 0, D), b.narrow(0, 0, D)),
          ops::linear(all, w.narrow(0, D, 2 * D), b.narrow(0, D, 2 * D))};
}

LastSlotProjection project_for_last_slot(const torch::nn::Linear& qkv, const at::Tensor& x) {
  return project_for_last_slot(qkv, x.select(1, x.size(1) - 1), x);
}

LastSlotProducts last_slot_products_bf16(const torch::nn::Linear& qkv, const at::Tensor& last, const at::Tensor& all) {
  const int64_t D = all.size(-1);
  const auto &w = qkv->weight, &b = qkv->bias;
  return {ops::product_bf16(last, w.narrow(0, 0, D)), b.narrow(0, 0, D),
          ops::product_bf16(all, w.narrow(0, D, 2 * D)), b.narrow(0, D, 2 * D)};
}

LastSlotProducts last_slot_products_bf16(const torch::nn::Linear& qkv, const at::Tensor& x) {
  return last_slot_products_bf16(qkv, x.select(1, x.size(1) - 1), x);
}

std::unique_ptr<SequenceModel> make_backbone_model(const ModelOptions& options, BackboneSpec spec) {
  TORCH_CHECK(spec.attention, "backbone needs an attention factory");
  return std::make_unique<BackboneModel>(options, spec);
}

}  // namespace seqrec::models
