#pragma once
// The attention-module interface (DESIGN.md "Attention module"). Internal to models/: it
// pulls in torch::nn, so only models/*.cpp include it.
#include <torch/torch.h>

namespace seqrec::models {

// Per-call context shared by every layer of one forward pass.
struct AttentionContext {
  at::Tensor key_padding;  // [B, L] bool, true at padded slots
  at::Tensor bias;         // optional precomputed causal/padding mask (softmax attention)
  at::Tensor positions;    // [L, D] the position-embedding rows of this length (right-aligned),
                           // for variants that encode positions inside attention (LightSANs)
};

class AttentionModuleImpl : public torch::nn::Module {
 public:
  // x [B, L, D] -> [B, L, D]; causal; a padded slot never changes a real slot's output.
  virtual at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) = 0;
  // The output at the last slot only, [B, D]; variants override it to skip work.
  virtual at::Tensor forward_last(const at::Tensor& x, AttentionContext& ctx) {
    return forward(x, ctx).select(1, x.size(1) - 1);
  }
  // Variant-specific initialisation after the backbone's generic one (Xavier matrices, zero
  // biases), drawing from `gen` so that every rank starts identical.
  virtual void initialise(at::Generator& gen) { (void)gen; }
  // Modules with EMA statistics expose them here so dist can all-reduce them before
  // the update (none for softmax attention).
  virtual std::vector<at::Tensor> ema_statistics() { return {}; }
};

}  // namespace seqrec::models
