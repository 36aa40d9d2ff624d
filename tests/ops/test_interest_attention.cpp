// LightSANs' causal item-to-interest aggregation and interest attention against loop-level
// references in double: lengths that break the chunking, left padding, all-padding rows,
// logits spread over hundreds (stability), causality, padding isolation, gradients against
// central differences.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/interest_attention/interest_attention.h"
#include "tests/ops/op_test_util.h"

namespace {

using namespace seqrec::ops;

at::Tensor naive_aggregation(const at::Tensor& x, const at::Tensor& a, const at::Tensor& pad) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), K = a.size(2);
  auto xd = x.to(torch::kFloat64).contiguous(), ad = a.to(torch::kFloat64).contiguous();
  auto X = xd.accessor<double, 3>(), A = ad.accessor<double, 3>();
  auto P = pad.accessor<bool, 2>();
  auto out = torch::zeros({B, L, K, D}, torch::kFloat64);
  auto O = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t j = 0; j < K; ++j) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= t; ++s)
          if (!P[b][s]) mx = std::max(mx, A[b][s][j]);
        if (std::isinf(mx)) continue;  // sees no real row: zeros
        double z = 0;
        for (int64_t s = 0; s <= t; ++s)
          if (!P[b][s]) z += std::exp(A[b][s][j] - mx);
        for (int64_t s = 0; s <= t; ++s)
          if (!P[b][s])
            for (int64_t d = 0; d < D; ++d) O[b][t][j][d] += std::exp(A[b][s][j] - mx) / z * X[b][s][d];
      }
  return out;
}

at::Tensor left_padding(const std::vector<int64_t>& lengths, int64_t L) {
  return seqrec::testing::padding_mask(lengths, L);
}

TEST(InterestAggregation, MatchesLoopReference) {
  torch::manual_seed(11);
  struct Case { int64_t B, L, D, K; std::vector<int64_t> lengths; double spread; };
  std::vector<Case> cases = {{1, 1, 3, 1, {1}, 1},          {2, 7, 5, 3, {7, 2}, 1},
                             {3, 67, 4, 5, {67, 33, 0}, 3}, {2, 130, 6, 2, {130, 97}, 1},
                             {2, 64, 3, 4, {64, 64}, 200},  {2, 100, 3, 3, {100, 70}, 400}};
  for (auto& c : cases)
    for (int64_t chunk : {int64_t{32}, int64_t{5}}) {
      auto x = torch::randn({c.B, c.L, c.D});
      auto a = torch::randn({c.B, c.L, c.K}) * c.spread;
      auto pad = left_padding(c.lengths, c.L);
      auto got = causal_interest_aggregation(x, a, pad, chunk);
      ASSERT_TRUE(torch::isfinite(got).all().item<bool>()) << "L=" << c.L;
      auto want = naive_aggregation(x, a, pad);
      EXPECT_TRUE(torch::allclose(got.to(torch::kFloat64), want, 1e-4, 1e-5))
          << "L=" << c.L << " chunk=" << chunk << " spread=" << c.spread << " max err "
          << (got.to(torch::kFloat64) - want).abs().max().item<double>();
    }
}

TEST(InterestAggregation, CausalAndPaddingIsolated) {
  torch::manual_seed(12);
  const int64_t L = 75;
  auto pad = left_padding({75, 30}, L);
  auto x = torch::randn({2, L, 4}), a = torch::randn({2, L, 3});
  auto base = causal_interest_aggregation(x, a, pad);
  auto x2 = x.clone(), a2 = a.clone();
  x2.select(1, 60).normal_();
  a2.select(1, 60).fill_(50.0);
  auto moved = causal_interest_aggregation(x2, a2, pad);
  EXPECT_TRUE(torch::equal(moved.narrow(1, 0, 60), base.narrow(1, 0, 60)));
  EXPECT_FALSE(torch::allclose(moved.narrow(1, 60, 15), base.narrow(1, 60, 15)));
  auto x3 = x.clone(), a3 = a.clone();
  x3[1].narrow(0, 0, 45).normal_(0, 10);
  a3[1].narrow(0, 0, 45).fill_(1e4);
  auto iso = causal_interest_aggregation(x3, a3, pad);
  auto real = pad.logical_not().view({2, L, 1, 1});
  EXPECT_TRUE(torch::allclose(iso * real, base * real, 1e-6, 1e-6));
  // Padded slots before the first item see nothing and give zeros, not NaN.
  EXPECT_TRUE(torch::equal(iso[1].narrow(0, 0, 45), torch::zeros({45, 3, 4})));
}

TEST(InterestAttention, MatchesLoopReference) {
  torch::manual_seed(13);
  const int64_t B = 2, H = 2, L = 5, Dh = 3, K = 4;
  auto q = torch::randn({B, H, L, Dh}, torch::kFloat64);
  auto keys = torch::randn({B, L, K, H * Dh}, torch::kFloat64);
  auto values = torch::randn({B, L, K, H * Dh}, torch::kFloat64);
  auto got = interest_attention(q, keys, values, 0.0, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < L; ++t) {
        std::vector<double> s(K);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < K; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < Dh; ++d)
            s[j] += q[b][h][t][d].item<double>() * keys[b][t][j][h * Dh + d].item<double>();
          s[j] /= std::sqrt(double(Dh));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < K; ++j) z += std::exp(s[j] - mx);
        for (int64_t d = 0; d < Dh; ++d) {
          double o = 0;
          for (int64_t j = 0; j < K; ++j) o += std::exp(s[j] - mx) / z * values[b][t][j][h * Dh + d].item<double>();
          EXPECT_NEAR(got[b][h][t][d].item<double>(), o, 1e-10);
        }
      }
}

TEST(InterestAggregation, GradientsMatchCentralDifferences) {
  torch::manual_seed(14);
  auto pad = left_padding({11, 6}, 11);
  auto x = torch::randn({2, 11, 3}, torch::kFloat64).requires_grad_();
  auto a = (torch::randn({2, 11, 2}, torch::kFloat64) * 3).requires_grad_();
  auto w = torch::randn({2, 11, 2, 3}, torch::kFloat64);
  auto f = [&] { return (causal_interest_aggregation(x, a, pad, 4) * w).sum(); };
  seqrec::testing::expect_gradients_match_central_differences(f, {x, a});
}

TEST(InterestAggregation, BadInputIsNamed) {
  auto x = torch::randn({1, 4, 2});
  EXPECT_THROW(causal_interest_aggregation(x, torch::randn({1, 5, 2}), torch::zeros({1, 4}, torch::kBool)),
               c10::Error);
  EXPECT_THROW(causal_interest_aggregation(x, torch::randn({1, 4, 2}), torch::zeros({1, 4}, torch::kBool), -1),
               c10::Error);
  EXPECT_THROW(interest_attention(torch::randn({1, 2, 4, 3}), torch::randn({1, 4, 2, 5}),
                                  torch::randn({1, 4, 2, 5}), 0.0, false),
               c10::Error);
}

}  // namespace
