// SASRec (Kang & McAuley 2018): item embedding scaled by sqrt(d) + learned positions,
// causal softmax self-attention blocks (pre-LN by default, post-LN as an option), point-wise
// FFN with dropout, final LayerNorm; scores are dot products with the shared item table.
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

#include "models/attention.h"
#include "models/model.h"
#include "ops/dropout/dropout.h"
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
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2), dh = D / heads_;
    // [B, L, 3, H, dh] -> three [B, H, L, dh] views
    auto qkv = qkv_(x).view({B, L, 3, heads_, dh}).permute({2, 0, 3, 1, 4});
    if (!ctx.bias.defined()) ctx.bias = ops::causal_padding_bias(ctx.key_padding, x.scalar_type());
    auto o = ops::causal_softmax_attention_biased(qkv[0], qkv[1], qkv[2], ctx.bias, dropout_, is_training());
    return out_(o.transpose(1, 2).reshape({B, L, D}));
  }

  // Output at the last slot only: the query of slot L-1 against every key. Under left
  // padding the last slot is real whenever the row has any item, so only key padding applies.
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) {
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2), dh = D / heads_;
    auto qkv = qkv_(x).view({B, L, 3, heads_, dh}).permute({2, 0, 3, 1, 4});  // 3 x [B, H, L, dh]
    auto q = qkv[0].narrow(2, L - 1, 1);
    auto k = qkv[1], v = qkv[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(dh)));
    // Padded keys are masked; the last slot itself always stays visible (as in the full op).
    auto masked = ctx.key_padding.clone();
    masked.select(1, L - 1).fill_(false);
    scores.masked_fill_(masked.view({B, 1, 1, L}), -std::numeric_limits<float>::infinity());
    auto o = torch::matmul(torch::softmax(scores, -1), v);  // [B, H, 1, dh]
    return out_(o.reshape({B, D}));
  }

 private:
  int64_t heads_;
  double dropout_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr};
};

// Point-wise feed-forward (SASRec's two 1x1 convolutions), dropout after each layer.
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t d, double dropout) : dropout_(dropout) {
    fc1_ = register_module("fc1", torch::nn::Linear(d, d));
    fc2_ = register_module("fc2", torch::nn::Linear(d, d));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = ops::dropout(torch::relu(fc1_(x)), dropout_, is_training());
    return ops::dropout(fc2_(h), dropout_, is_training());
  }

 private:
  double dropout_;
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(FeedForward);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelOptions& o) : norm_first_(o.norm_first) {
    auto ln = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)); };
    attn_ln_ = register_module("attn_ln", ln());
    ffn_ln_ = register_module("ffn_ln", ln());
    attn_ = register_module("attn", std::make_shared<SoftmaxAttentionImpl>(o.hidden, o.heads, o.dropout));
    ffn_ = register_module("ffn", FeedForward(o.hidden, o.dropout));
  }
  // The block's output at the last slot, [B, D].
  at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) {
    auto last = x.select(1, x.size(1) - 1);
    if (norm_first_) {
      last = last + attn_->forward_last(attn_ln_(x), ctx);
      return last + ffn_(ffn_ln_(last));
    }
    last = attn_ln_(last + attn_->forward_last(x, ctx));
    return ffn_ln_(last + ffn_(last));
  }

  at::Tensor forward(at::Tensor x, AttentionContext& ctx) {
    if (norm_first_) {
      x = x + attn_->forward(attn_ln_(x), ctx);
      return x + ffn_(ffn_ln_(x));
    }
    x = attn_ln_(x + attn_->forward(x, ctx));
    return ffn_ln_(x + ffn_(x));
  }

 private:
  bool norm_first_;
  torch::nn::LayerNorm attn_ln_{nullptr}, ffn_ln_{nullptr};
  std::shared_ptr<SoftmaxAttentionImpl> attn_;
  FeedForward ffn_{nullptr};
};
TORCH_MODULE(Block);

class SasRecImpl : public torch::nn::Module {
 public:
  explicit SasRecImpl(const ModelOptions& o) : o_(o) {
    items_ = register_module("item_emb", torch::nn::Embedding(o.num_items + 1, o.hidden));
    positions_ = register_module("pos_emb", torch::nn::Embedding(o.max_len, o.hidden));
    for (int64_t i = 0; i < o.blocks; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), Block(o)));
    final_ln_ = register_module(
        "final_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)));
  }

  at::Tensor encode(const at::Tensor& input) {
    AttentionContext ctx;
    at::Tensor keep;
    auto x = embed(input, ctx, keep);
    for (auto& b : blocks_) x = b->forward(x, ctx) * keep;
    return final_ln_(x) * keep;
  }

  // encode(input)[:, -1]: every block but the last runs on all slots (they feed the last
  // block's keys and values); the last block computes only the last slot's query and FFN.
  at::Tensor encode_last(const at::Tensor& input) {
    AttentionContext ctx;
    at::Tensor keep;
    auto x = embed(input, ctx, keep);
    for (size_t i = 0; i + 1 < blocks_.size(); ++i) x = blocks_[i]->forward(x, ctx) * keep;
    auto last = blocks_.back()->forward_last(x, ctx) * keep.select(1, input.size(1) - 1);
    return final_ln_(last) * keep.select(1, input.size(1) - 1);
  }

  at::Tensor item_embeddings() { return items_->weight; }

 private:
  at::Tensor embed(const at::Tensor& input, AttentionContext& ctx, at::Tensor& keep) {
    TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kLong, "input must be [B, L] int64, got ",
                input.sizes(), " ", input.scalar_type());
    TORCH_CHECK(input.size(1) <= o_.max_len, "input length ", input.size(1), " exceeds max_len ", o_.max_len);
    const int64_t L = input.size(1);
    ctx.key_padding = input.eq(0);
    keep = ctx.key_padding.logical_not().unsqueeze(-1).to(items_->weight.scalar_type());
    // Positions count from the right edge so the most recent item always has the same
    // position whatever the padding (sequences are left-padded).
    auto pos = torch::arange(o_.max_len - L, o_.max_len, input.options());
    auto x = items_(input) * std::sqrt(static_cast<double>(o_.hidden)) + positions_(pos).unsqueeze(0);
    return ops::dropout(x, o_.dropout, is_training()) * keep;
  }

  ModelOptions o_;
  torch::nn::Embedding items_{nullptr}, positions_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm final_ln_{nullptr};
};

// Xavier-normal for every matrix, zero biases, LayerNorm (1, 0); the padding row is zero
// (it never receives a gradient that matters: padded outputs are masked).
void initialise(torch::nn::Module& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : m.named_parameters()) {
    auto& t = p.value();
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
}

class SasRecModel : public SequenceModel {
 public:
  explicit SasRecModel(const ModelOptions& o) : o_(o), net_(std::make_shared<SasRecImpl>(o)) {
    initialise(*net_, o.init_seed);
    torch::NoGradGuard no_grad;
    net_->item_embeddings()[0].zero_();
  }
  at::Tensor encode(const at::Tensor& input) override { return net_->encode(input); }
  at::Tensor encode_last(const at::Tensor& input) override { return net_->encode_last(input); }
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
  const ModelOptions& options() const override { return o_; }

 private:
  ModelOptions o_;
  std::shared_ptr<SasRecImpl> net_;
};

}  // namespace

std::vector<std::string> known_models() { return {"sasrec"}; }

void validate(const ModelOptions& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  bool known = false;
  for (auto& n : known_models()) known |= n == o.model;
  if (!known) {
    std::string list;
    for (auto& n : known_models()) list += (list.empty() ? "" : ", ") + n;
    fail("unknown model '" + o.model + "' (known: " + list + ")");
  }
  if (o.num_items <= 0) fail("num_items must be > 0, got " + std::to_string(o.num_items));
  if (o.max_len <= 0) fail("max_len must be > 0, got " + std::to_string(o.max_len));
  if (o.hidden <= 0) fail("hidden must be > 0, got " + std::to_string(o.hidden));
  if (o.blocks <= 0) fail("blocks must be > 0, got " + std::to_string(o.blocks));
  if (o.heads <= 0 || o.hidden % o.heads != 0)
    fail("heads must be > 0 and divide hidden (" + std::to_string(o.hidden) + "), got " +
         std::to_string(o.heads));
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("dropout must be in [0, 1), got " + std::to_string(o.dropout));
}

std::string model_signature(const ModelOptions& o) {
  std::ostringstream s;
  s.precision(17);
  s << "model=" << o.model << "\nnum_items=" << o.num_items << "\nmax_len=" << o.max_len
    << "\nhidden=" << o.hidden << "\nblocks=" << o.blocks << "\nheads=" << o.heads
    << "\ndropout=" << o.dropout << "\nnorm_first=" << (o.norm_first ? 1 : 0)
    << "\nlayer_norm_eps=" << o.layer_norm_eps << "\n";
  return s.str();
}

namespace {
std::map<std::string, std::string> signature_fields(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("model signature line without '=': " + line);
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}
}  // namespace

ModelOptions parse_model_signature(const std::string& text) {
  ModelOptions o;
  for (auto& [k, v] : signature_fields(text)) {
    try {
      if (k == "model") o.model = v;
      else if (k == "num_items") o.num_items = std::stoll(v);
      else if (k == "max_len") o.max_len = std::stoll(v);
      else if (k == "hidden") o.hidden = std::stoll(v);
      else if (k == "blocks") o.blocks = std::stoll(v);
      else if (k == "heads") o.heads = std::stoll(v);
      else if (k == "dropout") o.dropout = std::stod(v);
      else if (k == "norm_first") o.norm_first = v == "1";
      else if (k == "layer_norm_eps") o.layer_norm_eps = std::stod(v);
      else throw std::invalid_argument("unknown key");
    } catch (const std::exception& e) {
      throw std::invalid_argument("model signature: bad entry '" + k + "=" + v + "'");
    }
  }
  return o;
}

std::string signature_difference(const std::string& a, const std::string& b) {
  auto fa = signature_fields(a), fb = signature_fields(b);
  std::string diff;
  for (auto& [k, v] : fa) {
    auto it = fb.find(k);
    const std::string w = it == fb.end() ? "(absent)" : it->second;
    if (w != v) diff += k + ": " + v + " vs " + w + "\n";
  }
  for (auto& [k, v] : fb)
    if (!fa.count(k)) diff += k + ": (absent) vs " + v + "\n";
  return diff;
}

std::unique_ptr<SequenceModel> make_model(const ModelOptions& o) {
  validate(o);
  return std::make_unique<SasRecModel>(o);
}

}  // namespace seqrec::models
