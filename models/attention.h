#pragma once
// The attention-module interface (DESIGN.md "Attention module"). Internal to models/: it
// pulls in torch::nn, so only models/*.cpp include it.
#include <torch/torch.h>

#include <string>

#include "models/model.h"

namespace seqrec::models {

// Per-call context shared by every layer of one forward pass.
struct AttentionContext {
  at::Tensor key_padding;  // [B, L] bool, true at padded slots
  bool causal = true;      // false under the cloze and last objectives: every slot sees every real slot
  UserInput users;         // the rows' users (may be empty)
  at::Tensor user;         // [B, Du] the backbone's user representation, when it has a user encoder
  at::Tensor bias;         // optional precomputed causal/padding mask (softmax attention)
  at::Tensor positions;    // [L, D] the position-embedding rows of this length (right-aligned),
                           // for variants that encode positions inside attention (LightSANs)
  at::Tensor code_weights; // [B, L, C, W] codeword assignment weights of the input items (LISA)
  at::Tensor code_index;   // [B, L, C] their hard codeword indices (LISA)
};

class AttentionModuleImpl : public torch::nn::Module {
 public:
  // x [B, L, D] -> [B, L, D]; causal unless !ctx.causal (modules that cannot attend
  // bidirectionally are refused the cloze and last objectives by validate()); a padded slot never
  // changes a real slot's output.
  virtual at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) = 0;
  // The output at the last slot only, [B, D]; variants override it to skip work.
  virtual at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) {
    return forward(x, ctx).select(1, x.size(1) - 1);
  }
  // Variant-specific initialisation after the backbone's generic one (Xavier matrices, zero
  // biases), drawing from `gen` so that every rank starts identical.
  virtual void initialise(at::Generator& gen) { (void)gen; }
  // Statistics-driven state (Routing's EMA centroids), as for InputCoderImpl below: sums of
  // the training forwards since the last update, all-reduced across ranks by the trainer,
  // then apply_statistics(); fixed shapes, so a rank without a forward still takes part.
  virtual std::vector<at::Tensor> pending_statistics() { return {}; }
  virtual void apply_statistics() {}
  // Loss terms accumulated by training forwards since the last call (summed over items).
  virtual at::Tensor take_auxiliary_loss() { return {}; }
};

// Optional: turns the rows' users into one vector each, ctx.user [B, Du], computed once per
// forward and read by every layer (FLASH4Rec's user-aware gate).
class UserEncoderImpl : public torch::nn::Module {
 public:
  // [batch, D] on `device` (the input's: a model without user parameters has no other to go by).
  virtual at::Tensor forward(const UserInput& users, int64_t batch, const at::Device& device) = 0;
};

// Optional front end of the backbone: turns the scaled item embeddings of the input into the
// residual stream (before positions and dropout), may leave per-item state in the context, and
// gives the table that hidden states are scored against (LISA's codebook quantizers).
class InputCoderImpl : public torch::nn::Module {
 public:
  // scaled [B, L, D] = item_emb(ids)·sqrt(D); ids [B, L] (0 = padding); item_table: the raw
  // table the ids index, as targets() receives it.
  virtual at::Tensor encode_input(const at::Tensor& scaled, const at::Tensor& ids, const at::Tensor& item_table,
                                  AttentionContext& ctx) = 0;
  // [num_items + 1, D] from the raw item table.
  virtual at::Tensor targets(const at::Tensor& item_table) = 0;
  virtual void initialise(at::Generator& gen) { (void)gen; }
  // Sums to be all-reduced across ranks, then apply_statistics() (EMA codebooks).
  virtual std::vector<at::Tensor> pending_statistics() { return {}; }
  virtual void apply_statistics() {}
  // Loss terms accumulated by training forwards since the last call (summed over items).
  virtual at::Tensor take_auxiliary_loss() { return {}; }
  // Online inference: fold one more item (scaled [1, 1, D]) into `state` (undefined before the
  // first item), fill ctx for a single-slot forward of that item, return its residual input.
  virtual bool supports_online() const { return false; }
  // One line on learned discrete state worth watching during training, computed from the raw
  // item table (LISA: codebook usage and code collisions); empty when there is none.
  virtual std::string describe_state(const at::Tensor& item_table) {
    (void)item_table;
    return {};
  }
  virtual at::Tensor online_step(const at::Tensor& scaled, at::Tensor& state, AttentionContext& ctx) {
    (void)scaled, (void)state, (void)ctx;
    return {};
  }
};

}  // namespace seqrec::models
