// The chunked full-catalogue softmax loss against Torch's cross_entropy on the whole logit
// matrix: values and gradients (hidden and table) for chunk sizes that divide T, do not,
// exceed it and are 1; central differences in double; the padding item is never a class;
// bad arguments are named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "ops/softmax_loss/softmax_loss.h"
#include "tests/ops/op_test_util.h"

namespace {
using seqrec::ops::softmax_loss_sum;

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
  for (int64_t chunk : {1, 5, 37, 64}) {
    auto hc = h0.clone().requires_grad_(), tc = t0.clone().requires_grad_();
    auto got = softmax_loss_sum(hc, tc, targets, chunk);
    EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-4) << "chunk " << chunk;
    auto g = torch::autograd::grad({got * 0.7}, {hc, tc});
    EXPECT_TRUE(torch::allclose(g[0], want_grads[0], 1e-4, 1e-5)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(g[1], want_grads[1], 1e-4, 1e-5)) << "chunk " << chunk;
    EXPECT_EQ(g[1][0].abs().max().item<float>(), 0.0f) << "the padding row is never a class";
  }
  // No target slots: zero loss, zero gradients.
  auto e = torch::zeros({0, D}).requires_grad_();
  auto z = softmax_loss_sum(e, t, torch::zeros({0}, torch::kLong));
  EXPECT_EQ(z.item<float>(), 0.0f);
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
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok, 0); }).find("chunk_rows"), std::string::npos);
}

}  // namespace
