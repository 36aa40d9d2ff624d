// The chunked full-catalogue softmax loss against Torch's cross_entropy on the whole logit
// matrix: values and gradients (hidden and table) for chunk sizes that divide T, do not,
// exceed it and are 1; central differences in double; the padding item is never a class;
// bad arguments are named; the fused CPU row passes against the ATen reference's. The sampled
// softmax against the full one (every item drawn once, no correction) and against a loop over
// its definition (repeats, accidental hits, a popularity correction).
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
using seqrec::ops::sampled_softmax_loss_sum;

at::Tensor naive(const at::Tensor& h, const at::Tensor& table, const at::Tensor& targets) {
  auto logits = h.mm(table.t());
  auto mask = torch::zeros({table.size(0)}, torch::kBool);
  mask[0] = true;
  logits = logits.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

// What `f` throws as a c10::Error, or "no error".
template <typename F>
std::string message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
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

// With label smoothing eps the loss is torch's label-smoothed cross-entropy over the N items
// (the padding column dropped, so it takes no share): values and both gradients, at two rates,
// kept and recomputed; gradients against central differences; a bad rate named.
TEST(SoftmaxLoss, LabelSmoothingGivesTheSmoothedCrossEntropy) {
  torch::manual_seed(5);
  const int64_t T = 23, D = 5, N = 9;
  auto h0 = torch::randn({T, D}), t0 = torch::randn({N + 1, D});
  auto targets = torch::randint(1, N + 1, {T}, torch::kLong);
  for (double eps : {0.1, 0.45})
    for (int64_t keep_bytes : {int64_t{0}, int64_t{1} << 30}) {
      auto h = h0.clone().requires_grad_(), t = t0.clone().requires_grad_();
      auto want = torch::nn::functional::cross_entropy(
          h.mm(t.narrow(0, 1, N).t()), targets - 1,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).label_smoothing(eps));
      auto want_grads = torch::autograd::grad({want}, {h, t});
      auto hc = h0.clone().requires_grad_(), tc = t0.clone().requires_grad_();
      auto got = softmax_loss_sum(hc, tc, targets, 7, keep_bytes, eps);
      const std::string at = "eps " + std::to_string(eps) + " keep_bytes " + std::to_string(keep_bytes);
      EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-4) << at;
      EXPECT_GT(std::abs(got.item<double>() - softmax_loss_sum(h0, t0, targets).item<double>()), 1e-2)
          << "smoothing changed nothing at " << at;
      auto g = torch::autograd::grad({got}, {hc, tc});
      EXPECT_TRUE(torch::allclose(g[0], want_grads[0], 1e-4, 1e-5)) << at;
      EXPECT_TRUE(torch::allclose(g[1].narrow(0, 1, N), want_grads[1].narrow(0, 1, N), 1e-4, 1e-5)) << at;
      EXPECT_EQ(g[1][0].abs().max().item<float>(), 0.0f) << "the padding row takes no share";
    }
  auto h = torch::randn({6, 3}, torch::kFloat64).requires_grad_();
  auto t = torch::randn({5, 3}, torch::kFloat64).requires_grad_();
  auto tg = torch::tensor({1, 4, 2, 2, 3, 4}, torch::kLong);
  seqrec::testing::expect_gradients_match_central_differences(
      [&] { return softmax_loss_sum(h, t, tg, 4, 0, 0.3); }, {h, t}, 1);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, tg, 4, 0, 1.0); }).find("label_smoothing must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, tg, 4, 0, -0.1); }).find("label_smoothing must be in [0, 1)"),
            std::string::npos);
}

TEST(SoftmaxLoss, BadArgumentsAreNamed) {
  auto h = torch::randn({4, 3}), t = torch::randn({5, 3});
  auto ok = torch::tensor({1, 2, 3, 4}, torch::kLong);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, torch::tensor({0, 1, 2, 3}, torch::kLong)); }).find("targets out of range"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, torch::tensor({1, 2, 3, 5}, torch::kLong)); }).find("targets out of range"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, torch::randn({5, 4}), ok); }).find("table must be"), std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok.narrow(0, 0, 3)); }).find("targets must be"), std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok, 8, -1); }).find("keep_bytes must be >= 0"), std::string::npos);
  EXPECT_NE(message([&] { softmax_loss_sum(h, t, ok, 0); }).find("chunk_rows"), std::string::npos);
}

TEST(SampledSoftmaxLoss, EveryItemDrawnOnceIsTheFullSoftmax) {
  torch::manual_seed(8);
  const int64_t N = 9;
  auto h = torch::randn({11, 4}, torch::kFloat64).requires_grad_();
  auto t = torch::randn({N + 1, 4}, torch::kFloat64).requires_grad_();
  auto targets = torch::randint(1, N + 1, {11}, torch::kLong);
  // The draw in any order; N uniform draws expect each item once: log_expected = log(N / N) = 0.
  auto sample = torch::randperm(N, torch::kLong) + 1;
  for (const auto& log_expected : {at::Tensor(), torch::zeros({N + 1}, torch::kFloat64)}) {
    auto got = sampled_softmax_loss_sum(h, t, targets, sample, log_expected);
    auto want = naive(h, t, targets);
    EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-10);
    auto g = torch::autograd::grad({got}, {h, t});
    auto w = torch::autograd::grad({want}, {h, t});
    EXPECT_TRUE(torch::allclose(g[0], w[0], 1e-9, 1e-10));
    EXPECT_TRUE(torch::allclose(g[1], w[1], 1e-9, 1e-10));
  }
}

// The definition, one target at a time.
at::Tensor sampled_by_loop(const at::Tensor& h, const at::Tensor& table, const at::Tensor& targets,
                           const at::Tensor& sample, const at::Tensor& log_expected) {
  auto total = torch::zeros({}, h.options());
  for (int64_t r = 0; r < h.size(0); ++r) {
    const int64_t y = targets[r].item<int64_t>();
    auto zy = h[r].dot(table[y]);  // the target's own logit is not corrected
    std::vector<at::Tensor> terms{zy.unsqueeze(0)};
    for (int64_t j = 0; j < sample.size(0); ++j) {
      const int64_t i = sample[j].item<int64_t>();
      if (i != y) terms.push_back((h[r].dot(table[i]) - log_expected[i]).unsqueeze(0));
    }
    total = total + torch::logsumexp(torch::cat(terms), 0) - zy;
  }
  return total;
}

TEST(SampledSoftmaxLoss, MatchesItsDefinitionWithRepeatsHitsAndCorrection) {
  torch::manual_seed(9);
  const int64_t N = 12;
  auto h = torch::randn({6, 5}, torch::kFloat64).requires_grad_();
  auto t = torch::randn({N + 1, 5}, torch::kFloat64).requires_grad_();
  auto targets = torch::tensor({3, 7, 7, 1, 12, 5}, torch::kLong);
  // Repeats (4 twice) and draws equal to targets (3, 7, 12): those leave their rows only.
  auto sample = torch::tensor({4, 3, 9, 4, 7, 12, 2}, torch::kLong);
  auto log_expected = torch::randn({N + 1}, torch::kFloat64);
  auto got = sampled_softmax_loss_sum(h, t, targets, sample, log_expected);
  auto want = sampled_by_loop(h, t, targets, sample, log_expected);
  EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-10);
  auto g = torch::autograd::grad({got}, {h, t});
  auto w = torch::autograd::grad({want}, {h, t});
  EXPECT_TRUE(torch::allclose(g[0], w[0], 1e-9, 1e-10));
  EXPECT_TRUE(torch::allclose(g[1], w[1], 1e-9, 1e-10));
  // The correction matters: without it the value differs.
  EXPECT_GT(std::abs(sampled_softmax_loss_sum(h, t, targets, sample, {}).item<double>() - got.item<double>()), 1e-3);
  // Float inputs with a float correction: the same to float rounding; no target rows: zero.
  auto got32 = sampled_softmax_loss_sum(h.detach().to(torch::kFloat32), t.detach().to(torch::kFloat32), targets, sample,
                                        log_expected.to(torch::kFloat32));
  EXPECT_NEAR(got32.item<double>(), want.item<double>(), 1e-4);
  EXPECT_EQ(sampled_softmax_loss_sum(h.narrow(0, 0, 0), t, targets.narrow(0, 0, 0), sample, log_expected).item<double>(),
            0.0);
}

// Many draws from a skewed distribution: the corrected sum estimates the full normaliser, so the
// loss approaches the full softmax's (an uncorrected one, or one that also corrected the target's
// logit, would stay off by the log of the draw's size or skew).
TEST(SampledSoftmaxLoss, ManySkewedDrawsApproachTheFullSoftmax) {
  torch::manual_seed(10);
  const int64_t N = 12, S = 200000;
  auto h = torch::randn({5, 4}, torch::kFloat64), t = torch::randn({N + 1, 4}, torch::kFloat64);
  auto targets = torch::tensor({1, 4, 12, 7, 2}, torch::kLong);
  auto q = torch::arange(1, N + 1, torch::kFloat64).pow(2);  // q(i) ~ i^2: item 12 drawn 144x item 1
  q = q / q.sum();
  auto sample = torch::multinomial(q, S, /*replacement=*/true) + 1;
  auto log_expected = torch::cat({torch::zeros({1}, torch::kFloat64), (q * S).log()});
  const double full = naive(h, t, targets).item<double>();
  EXPECT_NEAR(sampled_softmax_loss_sum(h, t, targets, sample, log_expected).item<double>(), full, 0.01 * full);
  EXPECT_GT(std::abs(sampled_softmax_loss_sum(h, t, targets, sample, {}).item<double>() - full), 1.0);
}

TEST(SampledSoftmaxLoss, BadArgumentsAreNamed) {
  auto h = torch::randn({4, 3}), t = torch::randn({5, 3});
  auto ok = torch::tensor({1, 2, 3, 4}, torch::kLong);
  const auto has = [](const std::string& m, const std::string& what) { return m.find(what) != std::string::npos; };
  EXPECT_TRUE(has(message([&] { sampled_softmax_loss_sum(h, t, ok, torch::tensor({0, 1}, torch::kLong), {}); }),
                  "sample must be item ids in [1, 4]"));
  EXPECT_TRUE(has(message([&] { sampled_softmax_loss_sum(h, t, torch::tensor({1, 2, 3, 5}, torch::kLong), ok, {}); }),
                  "targets must be item ids in [1, 4]"));
  EXPECT_TRUE(has(message([&] { sampled_softmax_loss_sum(h, t, ok, torch::zeros({0}, torch::kLong), {}); }),
                  "sample must be a non-empty int64 [S]"));
  EXPECT_TRUE(has(message([&] { sampled_softmax_loss_sum(h, t, ok, ok, torch::zeros({4})); }),
                  "log_expected must be [N + 1] = [5]"));
  EXPECT_TRUE(has(message([&] { sampled_softmax_loss_sum(h, torch::randn({5, 2}), ok, ok, {}); }),
                  "hidden [T, D] and table [N + 1, D] expected"));
}

}  // namespace
