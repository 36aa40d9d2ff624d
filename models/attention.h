#pragma once
// The attention-module interface (DESIGN.md "Attention module"). Internal to models/: it
// pulls in torch::nn, so only models/*.cpp include it.
#include <torch/torch.h>

#include <string>
#include <vector>

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
  at::Tensor padded_input; // [D] what the block's attention reads at a padded slot (set by each
                           // block before it attends): its LayerNorm's bias under pre-LN, since
                           // padded slots hold zeros; undefined (zeros) under post-LN
};

// The length slices of one batch laid end to end (SequenceModel::encode_slices): slice s has
// b_s rows of width L_s, its slots (row-major) at [offsets[s], offsets[s + 1]) of a flat
// [N, D] residual stream, N = offsets.back().
struct SliceLayout {
  std::vector<AttentionContext> ctx;  // one per slice; ctx[s].key_padding is [b_s, L_s]
  std::vector<int64_t> offsets;       // S + 1 entries
  at::Tensor last_slots;              // [Σ b_s] int64: each row's last slot in the flat order
  int64_t rows(size_t s) const { return ctx[s].key_padding.size(0); }
  int64_t width(size_t s) const { return ctx[s].key_padding.size(1); }
  // Every slice of a flat [N, ...] tensor as [b_s, L_s, ...] views. One split, not a narrow per
  // slice: a narrow's backward fills a whole [N, ...] gradient for its slice alone, so S narrows
  // cost S times the tensor; the split's backward joins the slices' gradients once.
  std::vector<at::Tensor> split(const at::Tensor& flat) const {
    std::vector<int64_t> sizes;
    for (size_t s = 0; s < ctx.size(); ++s) sizes.push_back(offsets[s + 1] - offsets[s]);
    auto parts = flat.split_with_sizes(sizes, 0);
    for (size_t s = 0; s < parts.size(); ++s) {
      std::vector<int64_t> shape{rows(s), width(s)};
      for (int64_t d = 1; d < flat.dim(); ++d) shape.push_back(flat.size(d));
      parts[s] = parts[s].view(shape);
    }
    return parts;
  }
  // Every slice's rows of a [Σ b_s, ...] tensor (one entry per row, as last_slots), as views.
  std::vector<at::Tensor> split_rows(const at::Tensor& per_row) const {
    std::vector<int64_t> sizes;
    for (size_t s = 0; s < ctx.size(); ++s) sizes.push_back(rows(s));
    return per_row.split_with_sizes(sizes, 0);
  }
  // f(s) for every slice s, concatenated along dimension 0.
  template <class F>
  at::Tensor each(F&& f) const {
    std::vector<at::Tensor> out;
    for (size_t s = 0; s < ctx.size(); ++s) out.push_back(f(s));
    return cat_rows(out);
  }
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
  // Every slice of a layout at once: x [N, D] -> [N, D], equal to forward() on each slice.
  // Variants override it to run their projections once over all N slots; the default runs
  // forward() per slice.
  virtual at::Tensor forward_slices(const at::Tensor& x, SliceLayout& layout) {
    auto xs = layout.split(x);
    return layout.each([&](size_t s) { return forward(xs[s], layout.ctx[s]).reshape({-1, x.size(1)}); });
  }
  // Each row's output at its last slot, [Σ b_s, D], equal to forward_last() on each slice.
  virtual at::Tensor forward_last_slices(const at::Tensor& x, SliceLayout& layout) {
    auto xs = layout.split(x);
    return layout.each([&](size_t s) { return forward_last(xs[s], layout.ctx[s]); });
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
