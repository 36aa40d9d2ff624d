#pragma once
// Sparsely-gated mixture-of-experts feed-forward layer (Shazeer et al. 2017 noisy top-k gating,
// Switch-style gate values and load-balancing loss, GShard/Switch capacity and token dropping)
// with expert parallelism: the experts are split over the ranks of an expert-parallel group and
// tokens travel to their experts and back with a differentiable all-to-all. Internal to models/.
//
// Semantics, identical for every layout of ranks (a run on P ranks computes exactly what one
// process computes on the concatenated tokens of all ranks, up to floating-point summation order):
// - Gating. logits = x·W_g ([T, E]). In training with `noisy`:
//     H = logits + n ⊙ (softplus(x·W_noise) + noise_eps),   n ~ N(0, 1)
//   where n[t, e] comes from a counter-based generator keyed by (seed, global token index, e) and
//   the seed is one 64-bit draw from Torch's default CPU generator per forward: a token gets the
//   same noise whichever rank holds it when the ranks' generators are seeded alike, and the
//   noise stream is part of the saved RNG state. Otherwise H = logits.
//   probs = softmax(H) over all E experts; the k choices are the k largest entries of H (ties to
//   the lower expert id); the gate value of a chosen expert is probs[e], NOT renormalised over
//   the k choices. This is the Switch fix for the top-1 pitfall of Shazeer's
//   Softmax(KeepTopK(H, 1)) = 1 (reference seed-routing-flash4rec.md C.4, fix (a)): the output
//   depends on probs[e], so the task loss trains W_g (and W_noise) even at k = 1.
// - Capacity and dropping. Global token order = the tokens of world rank 0, then rank 1, ...
//   (this rank's tokens follow those of all lower world ranks). C = ceil(capacity_factor·k·T_global/E)
//   slots per expert (the ceiling taken with 1e-9 slack, so 1.1·60/6 gives 11, not 12). Priority: every first choice in global token order, then every second
//   choice, and so on; an assignment whose slot in its expert is >= C is dropped and contributes
//   0 (the residual connection outside the layer carries the token). Every rank derives its
//   slots from the all-gathered per-expert counts of the other ranks, so the dropped set is the
//   single-process one. Capacity applies in training only: evaluation is dropless (C = k·T_global),
//   so a user's score does not depend on which users share its batch. Callers that split a
//   training batch into several forwards change the capacity: one forward per batch.
// - Output y_t = Σ_{kept choices e of t} probs_t[e] · FFN_e(x_t), FFN_e = fc2(dropout(act(fc1(x)))),
//   then dropout. Expert dropout masks are keyed by (one seed per forward, global expert id,
//   the row's slot in its expert) with ops::dropout_mask, so they too are independent of the
//   layout.
// - Load balancing (Switch): f_e = (global first choices of e, before dropping) / T_global;
//   each training forward adds balance_coef · E · Σ_e f_e · Σ_{this rank's t} probs_t[e] to the
//   auxiliary term, a SUM over this rank's tokens: summed over ranks and divided by T_global
//   (the trainer divides every loss sum by the global token count) it is α·E·Σ_e f_e·P_e.
//
// Collectives and SPMD contract: every forward runs, in this order, two all_gathers on `world`
// and three all_to_alls on `ep` (expert ids and slots, token rows, results); the backward runs
// an all_to_all on `ep` for each of the two differentiable ones (for the token rows only when x
// requires grad). Therefore every rank of the world must call forward the same number of
// times, in the same order relative to its other collectives, and every rank must run backward
// through the same forwards (the same graph: same layers, the loss depending on each output on
// every rank). A rank with no tokens
// (T = 0) still calls forward (and backward) and takes part in every collective. x must require
// grad on every rank or on none. The communicators must outlive the module and its graphs.
// Randomness: each training forward draws one 64-bit value from the default generator when
// `noisy` is on and one more when dropout > 0 (on every rank, whatever its tokens), so ranks
// seeded alike stay alike.
//
// Parameters (named_parameters keys):
//   w_gate [d, E], w_noise [d, E] (only when noisy): replicated on every rank; their gradients
//     are all-reduced over the world like any data-parallel parameter.
//   expert<g>.fc1.{weight,bias}, expert<g>.fc2.{weight,bias} for each LOCAL expert, <g> its GLOBAL
//     id: rank p of the expert-parallel group (P ranks) owns experts [p·E/P, (p+1)·E/P). An
//     expert's gradient is complete on its owner (it received every token routed to it from the
//     ranks of its group); with several expert-parallel groups, replicas of one expert are
//     all-reduced across groups only. Checkpoints key experts by global id, so a run saved at
//     2 ranks loads at 1 or 3.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace seqrec::models {

struct MoeOptions {
  int64_t dim = 0;                   // d, the model width
  int64_t inner = 0;                 // expert hidden width
  int64_t experts = 0;               // E, global number of experts
  int64_t top_k = 1;                 // k, 1 <= k <= E
  double capacity_factor = 1.25;     // > 0
  bool noisy = true;                 // noisy gating in training
  double noise_eps = 1e-2;           // >= 0, added to the softplus noise scale
  double balance_coef = 1e-2;        // >= 0, load-balancing loss weight α
  std::string activation = "relu";   // relu | gelu
  double dropout = 0.0;              // in [0, 1), inside the experts (after the activation and after fc2)
  uint64_t init_seed = 0;            // the constructor calls initialise(init_seed)
  // Data-parallel world, for the global token order and counts; nullptr = single process.
  dist::Comm* world = nullptr;
  // Expert-parallel group; nullptr or size 1 = every expert local. With more than one rank it
  // is the world or a group split from it (Comm::split, groups of equal size), E must be
  // divisible by its size, and `world` must be set. With several groups every group holds all
  // E experts: the trainer all-reduces an expert's gradients over its replicas (the world ranks
  // with the same expert-parallel rank), the gates' over the world.
  dist::Comm* ep = nullptr;
};

// Throws std::invalid_argument naming the first bad option ("MoeOptions.top_k ...").
void validate(const MoeOptions& o);

class MoeFeedForwardImpl : public torch::nn::Module {
 public:
  explicit MoeFeedForwardImpl(const MoeOptions& options);

  // x [T, d]: the real tokens of this rank, flattened (T may be 0) -> [T, d]. Collective (see
  // the file comment). Throws std::invalid_argument for a wrong shape before communicating.
  // priority [T] int64 (optional): distinct keys that order the tokens for capacity instead of
  // (rank, position); keys that do not depend on the layout (a hash of user and slot) make the
  // dropped set the same whatever the number of ranks and however a batch is spread over them.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& priority = {});

  // Xavier-normal expert matrices, zero biases, zero gates. Expert g draws from a generator
  // seeded by (seed, g) only, so its weights do not depend on which rank holds it. Draws
  // nothing from the default generator.
  void initialise(uint64_t seed);

  // The auxiliary loss accumulated by training forwards since the last call (a 0-dim tensor
  // on the graph), then cleared; undefined when there was none.
  at::Tensor take_auxiliary_loss();

  // The last forward's [T, k] bool mask of dropped assignments (column j = the j-th choice),
  // its [T, k] int64 choices (global expert ids, by decreasing H) and its capacity C.
  const at::Tensor& last_dropped() const { return last_dropped_; }
  const at::Tensor& last_choices() const { return last_choices_; }
  int64_t last_capacity() const { return last_capacity_; }

  const MoeOptions& options() const { return o_; }
  int64_t num_local_experts() const { return local_experts_; }
  int64_t first_local_expert() const { return first_expert_; }

  // Parameter groups for the trainer: the replicated gate parameters and this rank's expert
  // parameters.
  std::vector<at::Tensor> gate_parameters() const;
  std::vector<at::Tensor> expert_parameters() const;
  // The global expert id in a parameter key relative to this module ("expert3.fc1.weight" -> 3),
  // -1 for a key that is not an expert's.
  static int64_t expert_of_parameter(const std::string& key);

 private:
  struct Expert {
    int64_t id;  // global expert id
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  };
  at::Tensor run_expert(Expert& e, const at::Tensor& rows, const at::Tensor& slots, uint64_t dropout_seed);

  MoeOptions o_;
  std::unique_ptr<dist::Comm> own_world_, own_ep_;  // local comms standing in for nullptr
  dist::Comm* world_ = nullptr;
  dist::Comm* ep_ = nullptr;
  int64_t local_experts_ = 0, first_expert_ = 0;
  at::Tensor w_gate_, w_noise_;
  std::vector<Expert> experts_;
  at::Tensor aux_;
  at::Tensor last_dropped_, last_choices_;
  int64_t last_capacity_ = 0;
};
TORCH_MODULE(MoeFeedForward);

}  // namespace seqrec::models
