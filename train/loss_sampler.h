#pragma once
// The items a sampled-softmax step draws (--loss sampled): S items per optimizer step, with
// replacement, uniformly or in proportion to (training count + 1), shared by every target of
// the step on every rank. The draw is keyed by (seed, step) alone, so N ranks with batch b see
// the sample 1 rank with batch N·b sees, and a resumed run draws what it would have drawn.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace seqrec::train {

class LossSampler {
 public:
  // kind "uniform" | "popularity" (then counts [N + 1]: training occurrences of each item, index
  // 0 unused). Throws std::invalid_argument for another kind, S < 1 or counts of another size.
  LossSampler(const std::string& kind, int64_t negatives, int64_t num_items, uint64_t seed,
              const std::vector<double>& counts = {});
  // [S] int64 item ids in 1..N for optimizer step `step`.
  at::Tensor draw(int64_t step) const;
  // [N + 1] float: log(S · q(i)), the expected count of item i in a draw (index 0: 0).
  const at::Tensor& log_expected() const { return log_expected_; }
  // "S items per step, drawn uniformly with replacement (logQ-corrected)" and the like.
  std::string describe() const;

 private:
  std::string kind_;
  int64_t negatives_, num_items_;
  uint64_t seed_;
  std::vector<double> cdf_;  // popularity: cumulative (count + 1), cdf_[i] = sum over items 1..i
  at::Tensor log_expected_;
};

}  // namespace seqrec::train
