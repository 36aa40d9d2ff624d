#pragma once
// The attention-module interface (DESIGN.md "Attention module"). Internal to models/: it
// pulls in torch::nn, so only models/*.cpp include it.
#include <torch/torch.h>

namespace seqrec::models {

// Per-call context: which slots are padding, plus room for variant-specific state
// (online inference state, routing assignments) that later variants add.
struct AttentionContext {
  at::Tensor key_padding;  // [B, L] bool, true at padded slots
  at::Tensor bias;         // optional precomputed mask shared by every layer of a forward
};

class AttentionModuleImpl : public torch::nn::Module {
 public:
  // x [B, L, D] -> [B, L, D]; causal; a padded slot never changes a real slot's output.
  virtual at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) = 0;
  // Modules with EMA statistics expose them here so dist can all-reduce them before
  // the update (none for softmax attention).
  virtual std::vector<at::Tensor> ema_statistics() { return {}; }
};

}  // namespace seqrec::models
