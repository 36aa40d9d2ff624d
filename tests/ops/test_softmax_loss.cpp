// The chunked full-catalogue softmax loss against Torch's cross_entropy on the whole logit
// matrix: values and gradients (hidden and table) for chunk sizes that divide T, do not,
// exceed it and are 1; central differences in double; the padding item is never a class;
// bad arguments are named; the fused CPU row passes against the ATen reference's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/kernels.h"
#include "ops/softmax_loss/softmax_loss.h"
#include "tests/ops/op_test_util.h"

namespace {
using seqrec::ops::softmax_loss_sum;
using seqrec::ops::softmax_loss_sum_reference;

at::Tensor naive(const at::Tensor& h, const at::Tensor& table, const at::Tensor& targets) {
  auto logits = h.mm(table.t());
  auto mask = torch::zeros({table.size(0)}, torch::kBool);
  mask[0] = true;
  logits = logits.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

TEST(SoftmaxLoss, MatchesCrossEntropyForEveryChunking) {
  torch::manual_seed(3);
  const int64_t T = 37, D = 6, N = 11;
  auto h0 = torch::randn({T, D}), t0 = torch::randn({N + 1, D});
  auto targets = torch::randint(1, N + 1, {T}, torch::kLong);
  auto h = h0.clone().requires_grad_(), t = t0.clone().requires_grad_();
  auto want = naive(h, t, targets);
  auto want_grads = torch::autograd::grad({want * 0.7}, {h, t});
  for (int64_t keep_bytes : {int64_t{0}, int64_t{1} << 30})
    for (int64_t chunk : {1, 5, 37, 64}) {
      auto hc = h0.clone().requires_grad_(), tc = t0.clone().requires_grad_();
      auto got = softmax_loss_sum(hc, tc, targets, chunk, keep_bytes);
      const std::string at = "chunk " + std::to_string(chunk) + " keep_bytes " + std::to_string(keep_bytes);
      EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-4) << at;
      auto g = torch::autograd::grad({got * 0.7}, {hc, tc});
      EXPECT_TRUE(torch::allclose(g[0], want_grads[0], 1e-4, 1e-5)) << at;
      EXPECT_TRUE(torch::allclose(g[1], want_grads[1], 1e-4, 1e-5)) << at;
      EXPECT_EQ(g[1][0].abs().max().item<float>(), 0.0f) << "the padding row is never a class";
    }
  // No target slots: zero loss, zero gradients.
  auto e = torch::zeros({0, D}).requires_grad_();
  auto z = softmax_loss_sum(e, t, torch::zeros({0}, torch::kLong));
  EXPECT_EQ(z.item<float>(), 0.0f);
}

// Keeping the forward's probabilities (within the budget) and recomputing them give the same
// loss and gradients bit for bit; the budget is in bytes of the [T, N + 1] matrix; a kept
// matrix is consumed by the backward, so a second backward fails instead of reading it, while
// recomputed ones allow it.
TEST(SoftmaxLoss, KeptAndRecomputedProbabilitiesAgreeBitForBit) {
  torch::manual_seed(5);
  const int64_t T = 300, D = 16, N = 97;
  auto h0 = torch::randn({T, D}), t0 = torch::randn({N + 1, D});
  auto targets = torch::randint(1, N + 1, {T}, torch::kLong);
  const int64_t fits = T * (N + 1) * 4;
  for (int64_t chunk : {7, 128, 300}) {
    std::vector<at::Tensor> loss, gh, gt;
    for (int64_t keep_bytes : {int64_t{0}, fits - 1, fits}) {
      auto h = h0.clone().requires_grad_(), t = t0.clone().requires_grad_();
      auto l = softmax_loss_sum(h, t, targets, chunk, keep_bytes);
      auto g = torch::autograd::grad({l * 1.3}, {h, t});
      loss.push_back(l.detach());
      gh.push_back(g[0]);
      gt.push_back(g[1]);
    }
    for (size_t i = 1; i < loss.size(); ++i) {
      EXPECT_TRUE(torch::equal(loss[i], loss[0])) << "chunk " << chunk << " budget " << i;
      EXPECT_TRUE(torch::equal(gh[i], gh[0])) << "chunk " << chunk << " budget " << i;
      EXPECT_TRUE(torch::equal(gt[i], gt[0])) << "chunk " << chunk << " budget " << i;
    }
  }
  // Which way ran shows in a second backward: only recomputed probabilities survive one.
  auto h = h0.clone().requires_grad_(), t = t0.clone().requires_grad_();
  auto l = softmax_loss_sum(h, t, targets, 64, fits);
  l.backward({}, /*retain_graph=*/true);
  EXPECT_THROW(l.backward(), c10::Error) << "within the budget the probabilities are kept";
  auto r = softmax_loss_sum(h, t, targets, 64, fits - 1);
  r.backward({}, /*retain_graph=*/true);
  EXPECT_NO_THROW(r.backward()) << "over the budget they are recomputed";
  // Without gradients nothing is kept (and nothing is needed).
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(softmax_loss_sum(h0, t0, targets, 64, fits), softmax_loss_sum(h0, t0, targets, 64, 0)));
  }
}

// The fused row passes (on by default on the CPU) against the reference's ATen ops, at a
// catalogue the width of ML-1M's (rows wider than any vector, with a remainder), kept and
// recomputed, and with logits spread so far that most probabilities underflow (exp's argument
// below -87, where the fused exp stops at exp(-87)): the loss within 1e-6 relative, each
// gradient's largest difference within 1e-5 of its largest entry (exp's rounding, 2 ulp per
// probability, summed over 3,416 items). float and double.
TEST(SoftmaxLoss, FusedRowsMatchTheReference) {
  ASSERT_TRUE(seqrec::ops::fused_kernels());
  torch::manual_seed(8);
  const int64_t T = 203, D = 16, N = 3416;
  for (auto dtype : {torch::kFloat32, torch::kFloat64})
    for (double spread : {1.0, 40.0})
      for (int64_t keep_bytes : {int64_t{0}, int64_t{1} << 30}) {
        auto h0 = (torch::randn({T, D}) * spread).to(dtype), t0 = torch::randn({N + 1, D}).to(dtype);
        auto targets = torch::randint(1, N + 1, {T}, torch::kLong);
        const std::string at = std::string(c10::toString(c10::typeMetaToScalarType(h0.dtype()))) + " spread " +
                               std::to_string(spread) + " keep_bytes " + std::to_string(keep_bytes);
        auto run = [&](bool fused) {
          auto h = h0.clone().requires_grad_(), t = t0.clone().requires_grad_();
          auto l = fused ? softmax_loss_sum(h, t, targets, 64, keep_bytes)
                         : softmax_loss_sum_reference(h, t, targets, 64, keep_bytes);
          EXPECT_NE(l.grad_fn()->name().find(fused ? "SoftmaxLossFused" : "SoftmaxLossReference"), std::string::npos)
              << at << ": " << l.grad_fn()->name();
          auto g = torch::autograd::grad({l * 0.3}, {h, t});
          return std::vector<at::Tensor>{l.detach(), g[0], g[1]};
        };
        const auto got = run(true), want = run(false);
        EXPECT_NEAR(got[0].item<double>(), want[0].item<double>(), 1e-6 * std::abs(want[0].item<double>())) << at;
        for (int i : {1, 2}) {
          const double diff = (got[i] - want[i]).abs().max().item<double>();
          const double scale = want[i].abs().max().item<double>();
          EXPECT_LE(diff, 1e-5 * scale) << at << (i == 1 ? " hidden" : " table") << " gradient: max difference "
                                        << diff << " against a largest entry of " << scale;
        }
        EXPECT_EQ(got[2][0].abs().max().item<double>(), 0.0) << at << ": the padding row is never a class";
      }
}

TEST(SoftmaxLoss, GradientsMatchCentralDifferences) {
  torch::manual_seed(4);
  auto h = torch::randn({7, 3}, torch::kFloat64).requires_grad_();
  auto t = torch::randn({6, 3}, torch::kFloat64).requires_grad_();
  auto targets = torch::tensor({1, 5, 2, 2, 3, 4, 5}, torch::kLong);
  seqrec::testing::expect_gradients_match_central_differences(
      [&] { return softmax_loss_sum(h, t, targets, 3); }, {h, t}, 1);
}

TEST(SoftmaxLoss, BadArgumentsAreNamed) {
  auto h = torch::randn({4, 3}), t = torch::randn({5, 3});
  auto ok = torch::tensor({1, 2, 3, 4}, torch::kLong);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, torch::tensor({0, 1, 2, 3}, torch::kLong)); }).find("targets out of range"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, torch::tensor({1, 2, 3, 5}, torch::kLong)); }).find("targets out of range"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, torch::randn({5, 4}), ok); }).find("table must be"), std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok.narrow(0, 0, 3)); }).find("targets must be"), std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok, 8, -1); }).find("keep_bytes must be >= 0"), std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok, 0); }).find("chunk_rows"), std::string::npos);
}

}  // namespace
