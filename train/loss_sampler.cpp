#include "train/loss_sampler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "io/loader.h"

namespace seqrec::train {
namespace {
constexpr uint64_t kLossSampleTag = 0x5a3b1e5f7ull;
}

LossSampler::LossSampler(const std::string& kind, int64_t negatives, int64_t num_items, uint64_t seed,
                         const std::vector<double>& counts)
    : kind_(kind), negatives_(negatives), num_items_(num_items), seed_(seed) {
  if (kind != "uniform" && kind != "popularity")
    throw std::invalid_argument("--loss_sampler must be 'uniform' or 'popularity', got '" + kind + "'");
  if (negatives < 1) throw std::invalid_argument("--loss_negatives must be >= 1, got " + std::to_string(negatives));
  if (num_items < 1) throw std::invalid_argument("a sampled softmax needs at least one item");
  log_expected_ = torch::zeros({num_items + 1}, torch::kFloat32);
  auto* le = log_expected_.data_ptr<float>();
  const double S = static_cast<double>(negatives);
  if (kind == "uniform") {
    log_expected_.narrow(0, 1, num_items).fill_(std::log(S / static_cast<double>(num_items)));
    return;
  }
  if (static_cast<int64_t>(counts.size()) != num_items + 1)
    throw std::invalid_argument("popularity counts for " + std::to_string(counts.size()) + " ids, expected " +
                                std::to_string(num_items + 1));
  // Add-one smoothing: every item can be drawn, and no item's correction is infinite.
  cdf_.assign(num_items + 1, 0.0);
  for (int64_t i = 1; i <= num_items; ++i) cdf_[i] = cdf_[i - 1] + std::max(0.0, counts[i]) + 1.0;
  const double total = cdf_[num_items];
  for (int64_t i = 1; i <= num_items; ++i)
    le[i] = static_cast<float>(std::log(S * (cdf_[i] - cdf_[i - 1]) / total));
}

at::Tensor LossSampler::draw(int64_t step) const {
  auto out = torch::empty({negatives_}, torch::kInt64);
  auto* o = out.data_ptr<int64_t>();
  io::KeyedRng rng(seed_, kLossSampleTag, static_cast<uint64_t>(step));
  const bool uniform = cdf_.empty();  // the popularity kind alone has a distribution to invert
  for (int64_t j = 0; j < negatives_; ++j) {
    if (uniform) {
      o[j] = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(num_items_)));
    } else {
      const double x = rng.uniform() * cdf_.back();
      const int64_t item = std::upper_bound(cdf_.begin() + 1, cdf_.end(), x) - cdf_.begin();
      o[j] = std::min<int64_t>(std::max<int64_t>(item, 1), num_items_);
    }
  }
  return out;
}

std::string LossSampler::describe() const {
  return std::to_string(negatives_) + " items per step, drawn " +
         (kind_ == "uniform" ? "uniformly" : "in proportion to training count + 1") +
         " with replacement and shared by the step's targets on every rank, logQ-corrected, accidental hits removed";
}

}  // namespace seqrec::train
