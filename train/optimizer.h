#pragma once
// Adam with weight decay either as an L2 term in the gradient (as torch.optim.Adam) or decoupled
// from it (AdamW, as torch.optim.AdamW), written out so that its whole state is plain named
// tensors for checkpoints and so the update can run in place on flat buffers.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace seqrec::train {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.98;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // false: weight_decay x p is added to every parameter's gradient before the moments (L2, which
  // Adam's normalisation then rescales per coordinate). true: every weight matrix and embedding
  // table (a parameter of two or more dimensions) shrinks by lr x weight_decay each step apart
  // from the moments (AdamW, Loshchilov & Hutter); biases and normalisation gains (one
  // dimension) do not decay.
  bool decoupled = false;
};

// Whether a parameter of this shape decays under decoupled weight decay.
inline bool decays_decoupled(const at::Tensor& p) { return p.dim() >= 2; }

class Adam {
 public:
  Adam(std::vector<std::pair<std::string, at::Tensor>> params, AdamOptions options);
  // One update with learning rate `lr` (the schedule lives in the caller).
  void step(double lr);
  void zero_grad();
  int64_t steps() const { return step_; }

  // exp_avg/<name>, exp_avg_sq/<name> and "step".
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  // Throws std::runtime_error naming a missing or mis-shaped entry.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<at::Tensor> m_, v_;
  AdamOptions o_;
  int64_t step_ = 0;
};

// The learning rate as a function of the optimizer step: a linear warm-up to `lr` over the first
// warmup_steps steps, then `lr` held (constant), or held until decay_begin() and decayed from
// there to final_ratio * lr at step decay_end by half a cosine (cosine) or a straight line
// (linear), and held at the floor after (a decay that begins late is the warm-up/stable/decay
// shape: a plateaued constant-rate run annealed over its last epochs). decay_end is the run's planned length (epochs x steps per epoch), so a run
// that stops early by patience never reaches the floor; a warm-up that outlasts it goes straight
// to the floor (the trainer warns).
struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  std::string kind = "constant";  // constant | cosine | linear
  double final_ratio = 0.0;       // the floor, as a fraction of lr (cosine, linear)
  int64_t decay_end = 0;          // the step where the decay reaches the floor (cosine, linear)
  int64_t decay_start = 0;        // the step the decay begins at the earliest (the warm-up's end if later)

  int64_t decay_begin() const { return std::max(warmup_steps, decay_start); }

  // Throws std::invalid_argument naming the field: an unknown kind, a ratio outside [0, 1].
  void validate() const;
  // Whether a decaying schedule has steps to decay over after the warm-up.
  bool decays() const { return kind != "constant" && decay_end > decay_begin(); }
  double at(int64_t step) const;
  // "constant 0.001", "cosine 0.001 -> 1e-05 over steps 100-13600", with the warm-up when there
  // is one; equal texts mean equal schedules (resume compares them). A decay that never runs
  // within the run is "constant 0.001 (the linear decay planned from step ... )".
  std::string describe() const;
};

// The step up to which a schedule that describe() wrote as `described` holds its rate at lr
// (past any warm-up): the step its decay begins, INT64_MAX for a constant rate (a decay planned
// past the run's end included), -1 for a text describe() does not write. A resumed run may go on
// under another plan whose decay begins at or after its step when the saved one had not yet
// begun to decay either: up to that step both rates are the constant one.
int64_t held_until(const std::string& described);

// Scales gradients so their global L2 norm is at most max_norm; returns the norm before.
// extra_sq: squared norm of gradients held elsewhere (other ranks' expert shards), counted in
// the norm; also_scaled: further gradients scaled by the same factor (this rank's shards).
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double extra_sq = 0,
                      const std::vector<at::Tensor>& also_scaled = {});

}  // namespace seqrec::train
