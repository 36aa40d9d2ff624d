#pragma once
// The shared Transformer recommender every attention variant plugs into: item embedding
// scaled by sqrt(d), learned right-aligned positions (added at the input unless the variant
// encodes them inside attention), blocks of attention + point-wise FFN (pre-LN by default,
// post-LN as an option), a final LayerNorm, scores against the shared item table. Internal to
// models/: variants build an attention factory and call make_backbone_model.
#include <functional>
#include <memory>

#include "models/attention.h"
#include "models/model.h"

namespace seqrec::models {

using AttentionFactory = std::function<std::shared_ptr<AttentionModuleImpl>(int64_t layer)>;

// A block's position-wise layer in place of the dense FFN (FLASH4Rec's mixture of experts):
// x [B, L, D] -> [B, L, D], padded slots ignored; statistics and auxiliary losses as for
// attention modules.
class FeedForwardModuleImpl : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) = 0;
  virtual at::Tensor take_auxiliary_loss() { return {}; }
  // Whether a parameter key (relative to this module) belongs to an expert.
  virtual bool is_expert_parameter(const std::string& key) const { return false; }
};
using FeedForwardFactory = std::function<std::shared_ptr<FeedForwardModuleImpl>(int64_t layer)>;

struct BackboneSpec {
  AttentionFactory attention;
  bool positions_at_input = true;  // false: positions reach attention through ctx.positions only
  std::shared_ptr<InputCoderImpl> input_coder;  // optional (LISA's quantizers)
  // false: the attention ignores its input (LISA attends the input items' codes from the
  // context), so pre-LN blocks have no LayerNorm in front of it.
  bool attention_reads_input = true;
  std::shared_ptr<UserEncoderImpl> user_encoder;  // optional: fills ctx.user
  FeedForwardFactory feed_forward;                 // optional: replaces the dense FFN
};

std::unique_ptr<SequenceModel> make_backbone_model(const ModelOptions& options, BackboneSpec spec);

// A packed [3·D, D] query/key/value projection (rows: queries, keys, values) applied for the last
// slot alone: its query [B, D] and every slot's keys and values [B, L, 2·D]; the other slots'
// queries, which nothing reads there, are never computed.
struct LastSlotProjection {
  at::Tensor query, keys_values;
};
LastSlotProjection project_for_last_slot(const torch::nn::Linear& qkv, const at::Tensor& x);
// The same for joined slices (SliceLayout): queries from `last` [R, D] (each row's last slot),
// keys and values from `all` [N, D].
LastSlotProjection project_for_last_slot(const torch::nn::Linear& qkv, const at::Tensor& last, const at::Tensor& all);

// The same two products where ops::bf16_products(x) holds, in bfloat16 before their biases
// (ops::product_bf16), with the biases [D] and [2·D] beside them: for an attention op that adds
// them as it reads the products.
struct LastSlotProducts {
  at::Tensor query, query_bias, keys_values, keys_values_bias;
};
LastSlotProducts last_slot_products_bf16(const torch::nn::Linear& qkv, const at::Tensor& x);
LastSlotProducts last_slot_products_bf16(const torch::nn::Linear& qkv, const at::Tensor& last, const at::Tensor& all);

// A Linear layer applied to x in the run's `--matmul_precision` (ops/products.h): the models'
// layers call this, not the layer's forward.
at::Tensor apply_linear(const torch::nn::Linear& layer, const at::Tensor& x);

// SASRec's multi-head softmax attention (models/sasrec.cpp), for models that offer it as an
// alternative unit (FLASH4Rec without gated attention).
std::shared_ptr<AttentionModuleImpl> make_softmax_attention(const ModelOptions& options);

// One factory per --model, defined in models/<model>.cpp.
std::unique_ptr<SequenceModel> make_sasrec(const ModelOptions& options);
std::unique_ptr<SequenceModel> make_linrec(const ModelOptions& options);
std::unique_ptr<SequenceModel> make_lightsans(const ModelOptions& options);
std::unique_ptr<SequenceModel> make_lisa(const ModelOptions& options);
std::unique_ptr<SequenceModel> make_routing(const ModelOptions& options);
std::unique_ptr<SequenceModel> make_flash4rec(const ModelOptions& options, const ModelRuntime& runtime);

}  // namespace seqrec::models
