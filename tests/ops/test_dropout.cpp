// Dropout: the keep mask is the documented counter hash (checked against a scalar loop written
// from its definition), the fused CPU op equals x * mask bit for bit forward and backward (float
// and double, contiguous or not, across blocks and threads), the drop rate is p and kept values
// are scaled by 1 / (1 - p), and one seed draw per call makes it reproducible. The fused
// activation + dropout (a feed-forward layer's ReLU or GELU) against dropout(act(a)): ReLU bit
// for bit, GELU to its erf approximation's error, with the same keep bits and seed draws.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ops/cpu_features.h"
#include "ops/dropout/dropout.h"
#include "ops/softmax_attention/softmax_attention.h"
#include "tests/ops/op_test_util.h"

namespace {

using seqrec::ops::dropout_mask;
using seqrec::ops::dropout_reference;
using seqrec::ops::mix64;
using seqrec::ops::random_seed;

// The mask from its definition in dropout.h, one element at a time.
std::vector<float> scalar_mask(int64_t n, double p, uint64_t seed) {
  const uint64_t phi = 0x9E3779B97F4A7C15ull, base = mix64(seed ^ phi);
  const auto threshold = static_cast<uint64_t>(std::llround(p * 65536.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  std::vector<float> m(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t lane = (mix64(base + static_cast<uint64_t>(i / 4) * phi) >> (16 * (i % 4))) & 0xFFFF;
    m[static_cast<size_t>(i)] = lane >= threshold ? scale : 0.0f;
  }
  return m;
}

TEST(Dropout, MaskIsTheCounterHashOfItsDefinition) {
  const int prev = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (double p : {0.1, 0.2, 0.5})
      for (int64_t n : {1, 3, 105, 1024, 1027, 70001}) {  // partial words, one block, blocks and a tail
        const uint64_t seed = 0xC0FFEEull + static_cast<uint64_t>(n);
        auto got = dropout_mask(torch::empty({n}), p, seed);
        auto want = scalar_mask(n, p, seed);
        ASSERT_EQ(got.numel(), n);
        const float* g = got.data_ptr<float>();
        int64_t differ = 0;
        for (int64_t i = 0; i < n; ++i) differ += g[i] != want[static_cast<size_t>(i)];
        EXPECT_EQ(differ, 0) << "p " << p << " n " << n << " threads " << threads;
      }
  }
  at::set_num_threads(prev);
}

TEST(Dropout, FusedOpEqualsTheMaskProductBitForBit) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64})
    for (bool transposed : {false, true}) {
      torch::manual_seed(3);
      auto x = torch::randn({37, 3, 50}, dtype);
      if (transposed) x = x.transpose(0, 2);  // not contiguous: the mask follows the logical order
      x.requires_grad_();
      auto gout = torch::randn(x.sizes(), dtype);
      torch::manual_seed(21);
      auto fused = seqrec::ops::dropout(x, 0.2, true);
      ASSERT_TRUE(fused.grad_fn());
      EXPECT_NE(fused.grad_fn()->name().find("DropoutFused"), std::string::npos) << fused.grad_fn()->name();
      torch::manual_seed(21);
      auto want = dropout_reference(x, 0.2, random_seed());
      EXPECT_TRUE(torch::equal(fused, want)) << dtype << " transposed " << transposed;
      auto g_fused = torch::autograd::grad({fused}, {x}, {gout})[0];
      auto g_want = torch::autograd::grad({want}, {x}, {gout})[0];
      EXPECT_TRUE(torch::equal(g_fused, g_want)) << dtype << " transposed " << transposed;
    }
}

TEST(Dropout, DropsAtRatePAndScalesTheRest) {
  torch::manual_seed(5);
  auto x = torch::rand({1 << 20}) + 1.0f;  // no zeros, so a zero output is a dropped element
  for (double p : {0.1, 0.5}) {
    auto y = seqrec::ops::dropout(x, p, true);
    const double dropped = y.eq(0).to(torch::kDouble).mean().item<double>();
    EXPECT_NEAR(dropped, p, 0.003) << p;
    auto kept = y.ne(0);
    EXPECT_TRUE(torch::allclose(y.masked_select(kept), x.masked_select(kept) / (1.0 - p), 1e-6, 0)) << p;
  }
}

TEST(Dropout, OneSeedDrawPerCallMakesItReproducible) {
  auto x = torch::randn({4, 33});
  torch::manual_seed(8);
  auto a = seqrec::ops::dropout(x, 0.3, true), b = seqrec::ops::dropout(x, 0.3, true);
  EXPECT_FALSE(torch::equal(a, b)) << "two calls drew the same mask";
  torch::manual_seed(8);
  EXPECT_TRUE(torch::equal(a, seqrec::ops::dropout(x, 0.3, true)));
  // The call draws exactly one 64-bit seed.
  torch::manual_seed(8);
  seqrec::ops::dropout(x, 0.3, true);
  const uint64_t next = random_seed();
  torch::manual_seed(8);
  random_seed();
  EXPECT_EQ(next, random_seed());
}

TEST(Dropout, IdentityWhenOffAndBadRatesNamed) {
  auto x = torch::randn({3, 5});
  EXPECT_TRUE(seqrec::ops::dropout(x, 0.4, false).is_same(x));
  EXPECT_TRUE(seqrec::ops::dropout(x, 0.0, true).is_same(x));
  for (double p : {-0.1, 1.0, 1.5}) {
    try {
      seqrec::ops::dropout(x, p, true);
      ADD_FAILURE() << "no error for p " << p;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout probability must be in [0, 1)"), std::string::npos) << e.what();
    }
  }
}

TEST(Dropout, ReferenceUnderFusedKernelsOff) {
  const seqrec::testing::ScopedFusedKernels off(false);
  auto x = torch::randn({6, 7}).requires_grad_();
  torch::manual_seed(4);
  auto y = seqrec::ops::dropout(x, 0.25, true);
  EXPECT_EQ(y.grad_fn()->name().find("DropoutFused"), std::string::npos) << y.grad_fn()->name();
  torch::manual_seed(4);
  EXPECT_TRUE(torch::equal(y, dropout_reference(x, 0.25, random_seed())));
}

// tests/ops/CMakeLists.txt runs this binary again under SEQREC_CPU_LEVEL=avx2 and =baseline,
// where the kernels must take the capped path (or those runs would test nothing new), and this
// test alone under a bad value, which must be an error naming it.
TEST(CpuLevel, TheEnvironmentCapsTheKernelsPicked) {
  const char* env = std::getenv("SEQREC_CPU_LEVEL");
  const std::string level = env ? env : "";
  if (level == "avx2") {
    EXPECT_FALSE(seqrec::ops::cpu_has_avx512());
  } else if (level == "baseline") {
    EXPECT_FALSE(seqrec::ops::cpu_has_avx2_fma());
    EXPECT_FALSE(seqrec::ops::cpu_has_avx512());
  } else if (level.empty() || level == "avx512") {
    EXPECT_EQ(seqrec::ops::cpu_level_cap(), 2) << level;
  } else {  // tests/ops/CMakeLists.txt runs this test alone under a bad value too
    try {
      seqrec::ops::cpu_level_cap();
      ADD_FAILURE() << "no error for SEQREC_CPU_LEVEL=" << level;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("SEQREC_CPU_LEVEL must be baseline, avx2 or avx512, got '" + level + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

using seqrec::ops::Activation;
using seqrec::ops::activation_dropout;
using seqrec::ops::activation_dropout_reference;

const char* name_of(Activation act) { return act == Activation::kGelu ? "gelu" : "relu"; }

// The fused op and the composition from the same generator state, values and gradients, in
// training (p 0.2), with p 0 and in evaluation; contiguous or not; 1 and 2 threads. ReLU equals
// the composition bit for bit; GELU to its erf approximation (float) or to rounding (double),
// dropping exactly the same elements.
TEST(ActivationDropout, FusedEqualsTheComposition) {
  const int prev = at::get_num_threads();
  for (int threads : {1, 2})
    for (auto act : {Activation::kRelu, Activation::kGelu})
      for (auto dtype : {torch::kFloat32, torch::kFloat64})
        for (bool transposed : {false, true})
          for (auto [p, training] : {std::pair{0.2, true}, std::pair{0.0, true}, std::pair{0.2, false}}) {
            at::set_num_threads(threads);
            torch::manual_seed(3);
            auto a = torch::randn({37, 3, 50}, dtype) * 2;  // 5,550 elements: five blocks and a tail
            if (transposed) a = a.transpose(0, 2);
            a.requires_grad_();
            auto gout = torch::randn(a.sizes(), dtype);
            const std::string where = std::string(name_of(act)) + " " + c10::toString(dtype) + " p " +
                                      std::to_string(p) + (training ? " training" : " eval") +
                                      (transposed ? " transposed" : "") + " threads " + std::to_string(threads);
            torch::manual_seed(21);
            const uint64_t seed = random_seed();  // the call's draw when it drops
            torch::manual_seed(21);
            auto fused = activation_dropout(a, act, p, training);
            const uint64_t next_fused = random_seed();
            ASSERT_TRUE(fused.grad_fn()) << where;
            EXPECT_NE(fused.grad_fn()->name().find("ActivationDropoutFused"), std::string::npos) << where;
            torch::manual_seed(21);
            auto want = activation_dropout_reference(a, act, p, training);
            EXPECT_EQ(next_fused, random_seed()) << where << ": not the composition's seed draws";
            auto g_fused = torch::autograd::grad({fused}, {a}, {gout})[0];
            auto g_want = torch::autograd::grad({want}, {a}, {gout})[0];
            if (act == Activation::kRelu) {
              EXPECT_TRUE(torch::equal(fused, want)) << where;
              EXPECT_TRUE(torch::equal(g_fused, g_want)) << where;
              continue;
            }
            // The keep bits: the activation alone times dropout_mask, bit for bit (GELU's
            // smallest values are not 0 as the composition's are, so zeros do not tell).
            auto alone = activation_dropout(a.detach(), act, 0.0, false);
            auto mask = training && p > 0 ? dropout_mask(a, p, seed) : torch::ones_like(a);
            EXPECT_TRUE(torch::equal(fused, alone * mask)) << where << ": not dropout_mask's keep bits";
            const double tol = dtype == torch::kFloat32 ? 2e-6 : 1e-12;
            EXPECT_LT((fused - want).abs().max().item<double>(), tol) << where;
            EXPECT_LT((g_fused - g_want).abs().max().item<double>(), tol * 4) << where;
          }
  at::set_num_threads(prev);
}

// GELU's float Φ against the exact function in double over [-12, 12], and its derivative: the
// erf approximation's absolute error (1.5e-7) times |x| / 2, plus rounding.
TEST(ActivationDropout, GeluWithinItsErfApproximationOfTheExactFunction) {
  auto x = torch::linspace(-12, 12, 240001, torch::kFloat32).requires_grad_();
  auto y = activation_dropout(x, Activation::kGelu, 0.0, false);
  auto gy = torch::autograd::grad({y}, {x}, {torch::ones_like(x)})[0];
  auto xd = x.detach().to(torch::kFloat64);
  auto cdf = 0.5 * torch::erfc(-xd / std::sqrt(2.0));
  auto exact = xd * cdf;
  auto exact_grad = cdf + xd * torch::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
  const auto bound = 2e-7 * (1 + xd.abs());
  EXPECT_TRUE(((y.detach().to(torch::kFloat64) - exact).abs() <= bound).all().item<bool>())
      << "max error " << (y.detach().to(torch::kFloat64) - exact).abs().max().item<double>();
  EXPECT_TRUE(((gy.to(torch::kFloat64) - exact_grad).abs() <= 2 * bound).all().item<bool>())
      << "max gradient error " << (gy.to(torch::kFloat64) - exact_grad).abs().max().item<double>();
}

TEST(ActivationDropout, ReferenceUnderFusedKernelsOffAndBadRatesNamed) {
  auto a = torch::randn({6, 7}).requires_grad_();
  {
    const seqrec::testing::ScopedFusedKernels off(false);
    torch::manual_seed(4);
    auto y = activation_dropout(a, Activation::kGelu, 0.25, true);
    EXPECT_EQ(y.grad_fn()->name().find("ActivationDropoutFused"), std::string::npos) << y.grad_fn()->name();
    torch::manual_seed(4);
    EXPECT_TRUE(torch::equal(y, seqrec::ops::dropout(torch::gelu(a), 0.25, true)));
  }
  try {
    activation_dropout(a, Activation::kRelu, 1.0, true);
    ADD_FAILURE() << "no error for p 1";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout probability must be in [0, 1)"), std::string::npos) << e.what();
  }
}

using seqrec::ops::bias_activation_dropout;
using seqrec::ops::bias_activation_dropout_reference;

// The bfloat16 product's epilogue against its composition (widen, add the bias, activation and
// dropout, round): N = 13 (rows straddle the hash words) and 1,500 (a row in two pieces), each
// activation and none, bfloat16 and float32 results, dropping or not, 1 and 2 threads. Values and
// y's gradient bit for bit (GELU: to its approximation's rounding), the bias's gradient to float
// rounding, the same seed draws; bad arguments named.
TEST(BiasActivationDropout, FusedEqualsTheComposition) {
  const int prev = at::get_num_threads();
  const std::vector<std::optional<Activation>> acts{std::nullopt, Activation::kRelu, Activation::kGelu};
  for (int threads : {1, 2})
    for (int64_t N : {13, 1500})
      for (const auto& act : acts)
        for (auto out : {torch::kBFloat16, torch::kFloat32})
          for (auto [p, training] : {std::pair{0.2, true}, std::pair{0.2, false}}) {
            at::set_num_threads(threads);
            torch::manual_seed(7);
            auto y = (torch::randn({5, 9, N}) * 2).to(torch::kBFloat16).requires_grad_();
            auto bias = torch::randn({N}).requires_grad_();
            auto gout = torch::randn(y.sizes()).to(out);
            const std::string where = std::string(act ? name_of(*act) : "none") + " N " + std::to_string(N) + " " +
                                      c10::toString(out) + (training ? " training" : " eval") + " threads " +
                                      std::to_string(threads);
            torch::manual_seed(21);
            auto fused = bias_activation_dropout(y, bias, act, p, training, out);
            const uint64_t next_fused = random_seed();
            ASSERT_EQ(fused.scalar_type(), out) << where;
            EXPECT_NE(fused.grad_fn()->name().find("BiasActivationDropoutFused"), std::string::npos) << where;
            torch::manual_seed(21);
            auto want = bias_activation_dropout_reference(y, bias, act, p, training, out);
            EXPECT_EQ(next_fused, random_seed()) << where << ": not the composition's seed draws";
            auto g_fused = torch::autograd::grad({fused}, {y, bias}, {gout});
            auto g_want = torch::autograd::grad({want}, {y, bias}, {gout});
            EXPECT_EQ(g_fused[0].scalar_type(), torch::kBFloat16) << where;
            EXPECT_EQ(g_fused[1].scalar_type(), torch::kFloat32) << where;
            if (act && *act == Activation::kGelu) {
              EXPECT_LT(seqrec::testing::max_err(fused, want), out == torch::kBFloat16 ? 0.07 : 1e-5) << where;
              EXPECT_LE((fused.to(torch::kFloat) != want.to(torch::kFloat)).sum().item<int64_t>(), fused.numel() / 50)
                  << where;
              EXPECT_LE((g_fused[0] != g_want[0]).sum().item<int64_t>(), fused.numel() / 50) << where;
            } else {
              EXPECT_TRUE(torch::equal(fused, want)) << where;
              EXPECT_TRUE(torch::equal(g_fused[0], g_want[0])) << where;
            }
            EXPECT_TRUE(torch::allclose(g_fused[1], g_want[1], 1e-4, 1e-4))
                << where << ": " << seqrec::testing::max_err(g_fused[1], g_want[1]);
          }
  at::set_num_threads(prev);

  auto y = torch::randn({4, 6}).to(torch::kBFloat16);
  using seqrec::testing::expect_error;
  expect_error([&] { bias_activation_dropout(y.to(torch::kFloat), torch::randn({6}), {}, 0.1, true, torch::kFloat); },
               "takes a bfloat16 product");
  expect_error([&] { bias_activation_dropout(y, torch::randn({5}), {}, 0.1, true, torch::kFloat); },
               "takes a bfloat16 product");
  expect_error([&] { bias_activation_dropout(y, torch::randn({6}), {}, 0.1, true, torch::kFloat64); },
               "returns bfloat16 or float32");
  expect_error([&] { bias_activation_dropout(y, torch::randn({6}), {}, 1.0, true, torch::kFloat); },
               "dropout probability must be in [0, 1)");
  {
    const seqrec::testing::ScopedFusedKernels off(false);
    auto r = bias_activation_dropout(y, torch::randn({6}).requires_grad_(), Activation::kRelu, 0.1, true,
                                     torch::kBFloat16);
    EXPECT_EQ(r.grad_fn()->name().find("BiasActivationDropoutFused"), std::string::npos) << r.grad_fn()->name();
  }
}

// SASRec's probabilities at medium against their composition (widen, scale, bias, softmax,
// dropout, round): L 13 with padding (rows of one key, rows straddling hash words) and 1,100 (a
// row in two pieces), per-batch and shared bias, dropping or not, 1 and 2 threads. Values and the
// scores' gradient within bfloat16 rounding, exact zeros where masked or dropped, the same seed
// draws; bad arguments named.
TEST(SoftmaxDropoutBf16, FusedEqualsTheComposition) {
  using seqrec::ops::softmax_dropout_bf16;
  using seqrec::ops::softmax_dropout_bf16_reference;
  const int prev = at::get_num_threads();
  for (int threads : {1, 2})
    for (int64_t L : {13, 1100})
      for (bool batched : {true, false})
        for (auto [p, training] : {std::pair{0.2, true}, std::pair{0.2, false}}) {
          at::set_num_threads(threads);
          torch::manual_seed(9);
          const int64_t B = 2, H = 3;
          auto pad = torch::zeros({B, L}, torch::kBool);
          pad[1].narrow(0, 0, L / 3).fill_(true);
          auto bias = seqrec::ops::causal_padding_bias(pad, torch::kFloat);
          if (!batched) bias = bias.narrow(0, 0, 1).contiguous();
          auto scores = (torch::randn({B, H, L, L}) * 3).to(torch::kBFloat16).requires_grad_();
          auto gout = torch::randn({B, H, L, L}).to(torch::kBFloat16);
          const double scale = 0.25;
          const std::string where = "L " + std::to_string(L) + (batched ? " batched" : " shared") +
                                    (training ? " training" : " eval") + " threads " + std::to_string(threads);
          torch::manual_seed(21);
          auto fused = softmax_dropout_bf16(scores, bias, scale, p, training);
          const uint64_t next_fused = random_seed();
          ASSERT_EQ(fused.scalar_type(), torch::kBFloat16) << where;
          EXPECT_NE(fused.grad_fn()->name().find("SoftmaxDropoutBf16Fused"), std::string::npos) << where;
          torch::manual_seed(21);
          auto want = softmax_dropout_bf16_reference(scores, bias, scale, p, training);
          EXPECT_EQ(next_fused, random_seed()) << where << ": not the composition's seed draws";
          auto f = fused.to(torch::kFloat), w = want.to(torch::kFloat);
          EXPECT_TRUE(torch::equal(f == 0, w == 0)) << where << ": not the same masked and dropped slots";
          EXPECT_TRUE(((f - w).abs() <= w.abs() * 8e-3 + 1e-30).all().item<bool>())
              << where << ": " << seqrec::testing::max_err(f, w);
          auto g_fused = torch::autograd::grad({fused}, {scores}, {gout})[0].to(torch::kFloat);
          auto g_want = torch::autograd::grad({want}, {scores}, {gout})[0].to(torch::kFloat);
          EXPECT_TRUE(torch::equal(g_fused == 0, g_want == 0)) << where;
          EXPECT_LT(seqrec::testing::max_err(g_fused, g_want), 2e-2 * g_want.abs().max().item<double>()) << where;
          // The rows sum to 1 before dropout.
          if (!training) {
            EXPECT_LT((f.sum(-1) - 1).abs().max().item<double>(), L * 4e-3) << where;
          }
        }
  at::set_num_threads(prev);

  auto s = torch::randn({1, 1, 4, 4}).to(torch::kBFloat16);
  auto ok_bias = torch::zeros({1, 1, 4, 4});
  using seqrec::testing::expect_error;
  expect_error([&] { softmax_dropout_bf16(s.to(torch::kFloat), ok_bias, 1.0, 0.1, true); }, "takes bfloat16 scores");
  expect_error([&] { softmax_dropout_bf16(s, torch::zeros({1, 1, 4, 5}), 1.0, 0.1, true); }, "takes bfloat16 scores");
  expect_error([&] { softmax_dropout_bf16(s, ok_bias.clone().requires_grad_(), 1.0, 0.1, true); }, "takes no gradient");
  expect_error([&] { softmax_dropout_bf16(s, ok_bias, 1.0, 1.0, true); }, "dropout probability must be in [0, 1)");
}

}  // namespace
