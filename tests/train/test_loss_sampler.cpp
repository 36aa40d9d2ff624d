// The items a sampled-softmax step draws (train/loss_sampler.h): keyed by (seed, step) alone,
// in proportion to what the kind says, with the log expected counts the correction needs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/loss_sampler.h"

namespace {
using seqrec::train::LossSampler;

TEST(LossSampler, TheDrawIsKeyedBySeedAndStep) {
  const std::vector<double> counts = {0, 5, 0, 2, 9, 1};
  for (const std::string kind : {"uniform", "popularity"}) {
    LossSampler a(kind, 64, 5, 42, counts), b(kind, 64, 5, 42, counts), other_seed(kind, 64, 5, 43, counts);
    auto d = a.draw(7);
    EXPECT_EQ(d.sizes(), (std::vector<int64_t>{64}));
    EXPECT_EQ(d.scalar_type(), torch::kLong);
    EXPECT_GE(d.min().item<int64_t>(), 1);
    EXPECT_LE(d.max().item<int64_t>(), 5);
    EXPECT_TRUE(torch::equal(d, b.draw(7))) << kind << ": another sampler (another rank, a resumed run) draws the same";
    EXPECT_FALSE(torch::equal(d, a.draw(8))) << kind << ": each step draws anew";
    EXPECT_FALSE(torch::equal(d, other_seed.draw(7))) << kind;
  }
}

TEST(LossSampler, FrequenciesAndLogExpectedCountsFollowTheKind) {
  // Training counts 0, 2, 6, 14 over items 1..4: with add-one smoothing q = 1, 3, 7, 15 over 26.
  const std::vector<double> counts = {0, 0, 2, 6, 14};
  const int64_t S = 500, steps = 200;
  LossSampler pop("popularity", S, 4, 1, counts), uni("uniform", S, 4, 1);
  std::vector<double> seen_pop(5, 0), seen_uni(5, 0);
  for (int64_t step = 0; step < steps; ++step) {
    auto p = pop.draw(step), u = uni.draw(step);
    for (int64_t j = 0; j < S; ++j) {
      seen_pop[p[j].item<int64_t>()] += 1;
      seen_uni[u[j].item<int64_t>()] += 1;
    }
  }
  const double draws = static_cast<double>(S * steps);
  const double q[] = {0, 1.0 / 26, 3.0 / 26, 7.0 / 26, 15.0 / 26};
  for (int i = 1; i <= 4; ++i) {
    // 100,000 draws: the frequencies within 5 standard deviations of q and of 1/4.
    EXPECT_NEAR(seen_pop[i] / draws, q[i], 5 * std::sqrt(q[i] * (1 - q[i]) / draws)) << "item " << i;
    EXPECT_NEAR(seen_uni[i] / draws, 0.25, 5 * std::sqrt(0.25 * 0.75 / draws)) << "item " << i;
    EXPECT_NEAR(pop.log_expected()[i].item<float>(), std::log(S * q[i]), 1e-5) << "item " << i;
    EXPECT_NEAR(uni.log_expected()[i].item<float>(), std::log(S / 4.0), 1e-5) << "item " << i;
  }
  EXPECT_EQ(pop.log_expected().size(0), 5);
}

TEST(LossSampler, BadOptionsAreNamed) {
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([] { LossSampler("zipf", 10, 5, 1); }), "--loss_sampler must be 'uniform' or 'popularity', got 'zipf'");
  EXPECT_EQ(message([] { LossSampler("uniform", 0, 5, 1); }), "--loss_negatives must be >= 1, got 0");
  EXPECT_EQ(message([] { LossSampler("popularity", 10, 5, 1, {1, 2}); }), "popularity counts for 2 ids, expected 6");
}

}  // namespace
