// Adam against closed-form values, its state round trip, and gradient clipping.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

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

// Decoupled weight decay (AdamW): each weight matrix shrinks by lr x weight_decay before its
// Adam update, the moments see the bare gradient; a one-dimensional parameter (a bias, a
// normalisation gain) does not decay.
TEST(Adam, DecoupledDecayShrinksMatricesApartFromTheMoments) {
  AdamOptions o;
  o.weight_decay = 0.5;
  o.decoupled = true;
  auto w = torch::full({1, 1}, 0.7, torch::kFloat64).requires_grad_();
  auto b = torch::full({1}, 0.7, torch::kFloat64).requires_grad_();
  Adam adam({{"w", w}, {"b", b}}, o);
  double x = 0.7, y = 0.7, mx = 0, vx = 0, my = 0, vy = 0;
  const double lr = 0.01;
  for (int t = 1; t <= 5; ++t) {
    w.mutable_grad() = 2 * w.detach();  // the gradient of w^2, no decay term
    b.mutable_grad() = 2 * b.detach();
    adam.step(lr);
    const auto adam_step = [&](double& p, double& m, double& v, double decay) {
      const double g = 2 * p;
      p *= 1 - lr * decay;
      m = o.beta1 * m + (1 - o.beta1) * g;
      v = o.beta2 * v + (1 - o.beta2) * g * g;
      const double mh = m / (1 - std::pow(o.beta1, t)), vh = v / (1 - std::pow(o.beta2, t));
      p -= lr * mh / (std::sqrt(vh) + o.eps);
    };
    adam_step(x, mx, vx, o.weight_decay);
    adam_step(y, my, vy, 0.0);
    EXPECT_NEAR(w.item<double>(), x, 1e-12) << "step " << t;
    EXPECT_NEAR(b.item<double>(), y, 1e-12) << "step " << t;
  }
  // The same run under L2 differs: there the decay enters the moments.
  auto w2 = torch::full({1, 1}, 0.7, torch::kFloat64).requires_grad_();
  o.decoupled = false;
  Adam l2({{"w", w2}}, o);
  for (int t = 1; t <= 5; ++t) {
    w2.mutable_grad() = 2 * w2.detach();
    l2.step(lr);
  }
  EXPECT_GT(std::abs(w2.item<double>() - x), 1e-4);
  // With no gradient at all a decoupled matrix still shrinks, by exactly (1 - lr wd) per step
  // (its moments stay 0).
  auto z = torch::full({2, 2}, 1.0, torch::kFloat64).requires_grad_();
  o.decoupled = true;
  Adam idle({{"z", z}}, o);
  for (int t = 1; t <= 3; ++t) {
    z.mutable_grad() = torch::zeros_like(z);
    idle.step(lr);
  }
  EXPECT_NEAR(z[0][0].item<double>(), std::pow(1 - lr * o.weight_decay, 3), 1e-12);
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

TEST(LrSchedule, WarmUpThenConstant) {
  LrSchedule s;
  s.lr = 0.01;
  s.warmup_steps = 4;
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(0), 0.0025);
  EXPECT_DOUBLE_EQ(s.at(3), 0.01);
  EXPECT_DOUBLE_EQ(s.at(4), 0.01);
  EXPECT_DOUBLE_EQ(s.at(1000000), 0.01);
  EXPECT_EQ(s.describe(), "constant 0.01, linear warm-up over the first 4 steps");
}

TEST(LrSchedule, CosineAndLinearDecayFromTheWarmUpToTheFloor) {
  LrSchedule c;
  c.lr = 0.01;
  c.warmup_steps = 10;
  c.kind = "cosine";
  c.final_ratio = 0.1;
  c.decay_end = 110;
  c.validate();
  EXPECT_DOUBLE_EQ(c.at(4), 0.005) << "the warm-up comes first";
  EXPECT_DOUBLE_EQ(c.at(10), 0.01) << "the decay starts at the full rate";
  EXPECT_NEAR(c.at(60), 0.01 * (0.1 + 0.9 * 0.5), 1e-15) << "halfway: halfway between lr and the floor";
  EXPECT_NEAR(c.at(35), 0.01 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4))), 1e-15);
  EXPECT_NEAR(c.at(110), 0.001, 1e-15);
  EXPECT_NEAR(c.at(5000), 0.001, 1e-15) << "held at the floor past the planned end";
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LT(c.at(t), c.at(t - 1)) << "step " << t;
  EXPECT_EQ(c.describe(), "cosine 0.01 -> 0.001 over steps 10-110, linear warm-up over the first 10 steps");

  LrSchedule l = c;
  l.kind = "linear";
  l.warmup_steps = 0;
  l.final_ratio = 0;
  l.decay_end = 100;
  EXPECT_DOUBLE_EQ(l.at(0), 0.01);
  EXPECT_NEAR(l.at(25), 0.0075, 1e-15);
  EXPECT_NEAR(l.at(100), 0.0, 1e-15);
  EXPECT_NE(l.describe(), c.describe());
}

TEST(LrSchedule, BadSettingsAreNamed) {
  auto error_of = [](LrSchedule s) {
    try {
      s.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LrSchedule s;
  s.kind = "step";
  EXPECT_NE(error_of(s).find("--lr_schedule must be constant, cosine or linear; got 'step'"), std::string::npos);
  s.kind = "cosine";
  s.decay_end = 100;
  s.final_ratio = 1.5;
  EXPECT_NE(error_of(s).find("--lr_final_ratio must be in [0, 1]"), std::string::npos);
  s.final_ratio = 0;
  EXPECT_EQ(error_of(s), "");
  EXPECT_TRUE(s.decays());
  // A warm-up that outlasts the planned run leaves nothing to decay over: the trainer warns,
  // and past the warm-up the rate is the floor.
  s.warmup_steps = 100;
  EXPECT_EQ(error_of(s), "");
  EXPECT_FALSE(s.decays());
  EXPECT_DOUBLE_EQ(s.at(99), s.lr);
  EXPECT_DOUBLE_EQ(s.at(100), 0.0);
}

// A decay that begins late: the rate held at lr up to decay_start, then the decay over the rest.
TEST(LrSchedule, DecayBeginsLateAndNeverBeforeTheWarmUpEnds) {
  LrSchedule s;
  s.lr = 0.01;
  s.kind = "linear";
  s.decay_start = 50;
  s.decay_end = 150;
  s.validate();
  EXPECT_TRUE(s.decays());
  EXPECT_DOUBLE_EQ(s.at(0), 0.01);
  EXPECT_DOUBLE_EQ(s.at(49), 0.01);
  EXPECT_DOUBLE_EQ(s.at(50), 0.01) << "the decay starts at the full rate";
  EXPECT_NEAR(s.at(100), 0.005, 1e-15);
  EXPECT_NEAR(s.at(125), 0.0025, 1e-15);
  EXPECT_NEAR(s.at(150), 0.0, 1e-15);
  EXPECT_EQ(s.describe(), "linear 0.01 -> 0 over steps 50-150");
  // A warm-up that ends later than decay_start delays the decay to the warm-up's end.
  s.warmup_steps = 80;
  EXPECT_EQ(s.decay_begin(), 80);
  EXPECT_DOUBLE_EQ(s.at(79), 0.01);
  EXPECT_NEAR(s.at(115), 0.005, 1e-15);
  // A decay planned to begin at or past the end never runs.
  s.warmup_steps = 0;
  s.decay_start = 150;
  EXPECT_FALSE(s.decays());
  EXPECT_DOUBLE_EQ(s.at(149), 0.01);
  // Over the run's steps that is the constant rate, and it is described as one, so that a run
  // resumed to go on under the decay counts as a constant-rate run continued.
  EXPECT_EQ(s.describe(), "constant 0.01 (the linear decay planned from step 150 begins at or after the run's end, step 150)");
  s.decay_start = -1;
  EXPECT_THROW(s.validate(), std::invalid_argument);
}

// held_until reads back what describe() wrote: where the held rate ends (a resume's test).
TEST(LrSchedule, HeldUntilReadsTheDescription) {
  LrSchedule s;
  s.lr = 0.01;
  EXPECT_EQ(held_until(s.describe()), std::numeric_limits<int64_t>::max());
  s.warmup_steps = 7;
  EXPECT_EQ(held_until(s.describe()), std::numeric_limits<int64_t>::max());
  s.kind = "linear";
  s.decay_start = 50;
  s.decay_end = 150;
  EXPECT_EQ(held_until(s.describe()), 50);
  s.kind = "cosine";
  s.warmup_steps = 80;
  EXPECT_EQ(held_until(s.describe()), 80) << s.describe();
  s.decay_start = 150;
  s.warmup_steps = 0;
  EXPECT_EQ(held_until(s.describe()), std::numeric_limits<int64_t>::max()) << s.describe();
  EXPECT_EQ(held_until("constant (written before --lr_schedule existed)"), std::numeric_limits<int64_t>::max());
  for (const char* bad : {"", "step 0.01", "linear 0.01 -> 0", "linear 0.01 -> 0 over steps x-9", "cosine 0.01 over steps 12"})
    EXPECT_EQ(held_until(bad), -1) << bad;
}

}  // namespace
