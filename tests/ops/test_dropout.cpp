// Dropout: the keep mask is the documented counter hash (checked against a scalar loop written
// from its definition), the fused CPU op equals x * mask bit for bit forward and backward (float
// and double, contiguous or not, across blocks and threads), the drop rate is p and kept values
// are scaled by 1 / (1 - p), and one seed draw per call makes it reproducible.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "ops/dropout/dropout.h"
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

}  // namespace
