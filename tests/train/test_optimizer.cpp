// Adam against closed-form values, its state round trip, and gradient clipping.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "train/optimizer.h"

namespace {
using namespace seqrec::train;

TEST(Adam, FirstStepMovesEachWeightByLr) {
  // After one step m/(sqrt(v)+eps) = g/|g| (bias-corrected), so every weight moves by lr
  // against the sign of its gradient (eps is negligible for |g| >> 1e-8).
  auto p = torch::tensor({1.0f, -2.0f, 3.0f}).requires_grad_();
  p.mutable_grad() = torch::tensor({0.5f, -4.0f, 1e-3f});
  Adam adam({{"p", p}}, AdamOptions{});
  adam.step(0.1);
  auto want = torch::tensor({0.9f, -1.9f, 2.9f});
  EXPECT_TRUE(torch::allclose(p.detach(), want, 1e-5, 1e-5)) << p;
}

TEST(Adam, MatchesTheUpdateRuleOverSteps) {
  AdamOptions o;
  o.weight_decay = 0.1;
  auto p = torch::tensor({0.7}, torch::kFloat64).requires_grad_();
  Adam adam({{"p", p}}, o);
  double x = 0.7, m = 0, v = 0;
  for (int t = 1; t <= 5; ++t) {
    const double g = 2 * x + o.weight_decay * x;  // gradient of x^2, plus L2
    p.mutable_grad() = torch::tensor({2 * p.item<double>()}, torch::kFloat64);
    adam.step(0.01);
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    const double mh = m / (1 - std::pow(o.beta1, t)), vh = v / (1 - std::pow(o.beta2, t));
    x -= 0.01 * mh / (std::sqrt(vh) + o.eps);
    EXPECT_NEAR(p.item<double>(), x, 1e-12) << "step " << t;
  }
  EXPECT_EQ(adam.steps(), 5);
}

TEST(Adam, StateRoundTripContinuesIdentically) {
  auto make = [] { return torch::tensor({1.0f, 2.0f}).requires_grad_(); };
  auto a = make(), b = make();
  Adam oa({{"w", a}}, {}), ob({{"w", b}}, {});
  for (int i = 0; i < 3; ++i) {
    a.mutable_grad() = a.detach() * 0.3;
    oa.step(0.01);
  }
  {
    torch::NoGradGuard g;
    b.copy_(a);
  }
  ob.load_state(oa.state());
  for (int i = 0; i < 3; ++i) {
    a.mutable_grad() = a.detach() * 0.3;
    b.mutable_grad() = b.detach() * 0.3;
    oa.step(0.01);
    ob.step(0.01);
  }
  EXPECT_TRUE(torch::equal(a, b));
  auto bad = oa.state();
  bad.erase(bad.begin() + 1);
  EXPECT_THROW(ob.load_state(bad), std::runtime_error);
}

TEST(ClipGradNorm, ScalesToTheBound) {
  auto p = torch::zeros({2}).requires_grad_();
  p.mutable_grad() = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(clip_grad_norm({p}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-5);
  EXPECT_NEAR(clip_grad_norm({p}, 10.0), 1.0, 1e-5);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-5) << "below the bound: unchanged";
}

}  // namespace
