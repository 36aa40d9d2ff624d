// --fused_kernels (ops::set_fused_kernels): on, each op with a fused CPU kernel runs it (its
// autograd node); off, the same call runs the op's ATen reference, bit for bit what calling the
// reference directly gives.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/dropout/dropout.h"
#include "ops/gated_attention/gated_attention.h"
#include "ops/interest_attention/interest_attention.h"
#include "ops/kernels.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/lisa_attention/lisa_attention.h"
#include "ops/products.h"
#include "ops/routing_attention/routing_attention.h"
#include "ops/softmax_attention/softmax_attention.h"
#include "ops/softmax_loss/softmax_loss.h"
#include "tests/ops/op_test_util.h"

namespace {

using namespace seqrec::ops;

struct Case {
  std::string name;
  std::string fused_node;                      // the fused kernel's autograd node
  std::function<at::Tensor()> call;            // what the models call
  std::function<at::Tensor()> reference;       // the reference, called directly
};

std::vector<Case> cases() {
  torch::manual_seed(11);
  const int64_t B = 2, H = 1, L = 13, D = 8;
  auto pad = torch::zeros({B, L}, torch::kBool);
  pad[1].narrow(0, 0, 4).fill_(true);
  auto grad = [](at::Tensor t) { return t.requires_grad_(); };
  std::vector<Case> out;

  auto q = grad(torch::randn({B, H, L, D})), k = grad(torch::randn({B, H, L, D})), v = grad(torch::randn({B, H, L, D}));
  out.push_back({"linear", "CausalLinearAttentionFused", [=] { return causal_linear_attention(q, k, v, 4); },
                 [=] { return causal_linear_attention_reference(q, k, v, 4); }});

  out.push_back({"linrec", "LinrecGlobalPaperFused",
                 [=] { return linrec_attention(q, k, v, pad, LinrecNorm::kPaper, LinrecForm::kGlobal); },
                 [=] { return linrec_attention_reference(q, k, v, pad, LinrecNorm::kPaper, LinrecForm::kGlobal); }});

  auto kf = grad(torch::randn({B, L, D})), vf = grad(torch::randn({B, L, D}));
  auto lk = grad(torch::randn({B, L, 3})), lv = grad(torch::randn({B, L, 3}));
  out.push_back({"interest", "CausalInterestScan",
                 [=] { return causal_interest_attention(q, kf, vf, lk, lv, pad, 0.0, false); },
                 [=] {
                   return interest_attention(q, causal_interest_aggregation(kf, lk, pad),
                                             causal_interest_aggregation(vf, lv, pad), 0.0, false);
                 }});

  const int64_t C = 2, W = 4;
  auto weights = grad(torch::softmax(torch::randn({B, L, C, W}), -1));
  auto index = torch::randint(W, {B, L, C}, torch::kLong);
  auto table = grad(torch::randn({C, W, W})), values = grad(torch::randn({C, W, D}));
  out.push_back({"lisa", "LisaAttentionFused",
                 [=] { return lisa_attention(weights, index, pad, table, values, 0.9); },
                 [=] { return lisa_attention_reference(weights, index, pad, table, values, 0.9); }});

  auto r = grad(torch::randn({B, H, L, D}));
  auto mu = torch::randn({H, 3, D});
  mu = mu / mu.norm(2, -1, true);
  const auto plan = causal_balanced_routing(r.detach(), mu, pad, 4, 4);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  out.push_back({"routing", "RoutedAttention", [=] { return routed_attention(r, v, plan, pad, scale, 0.0, false); },
                 [=] { return routed_attention_reference(r, v, plan, pad, scale, 0.0, false); }});

  auto hidden = grad(torch::randn({L, D})), items = grad(torch::randn({7, D}));
  auto targets = torch::randint(1, 7, {L}, torch::kLong);
  out.push_back({"softmax_loss", "SoftmaxLossFused", [=] { return softmax_loss_sum(hidden, items, targets, 5, 0); },
                 [=] { return softmax_loss_sum_reference(hidden, items, targets, 5, 0); }});

  out.push_back({"dropout", "DropoutFused",
                 [=] {
                   torch::manual_seed(17);
                   return seqrec::ops::dropout(q, 0.3, true);
                 },
                 [=] {
                   torch::manual_seed(17);
                   return dropout_reference(q, 0.3, random_seed());
                 }});
  return out;
}

TEST(FusedKernels, OnByDefaultAndTheOpsRunThem) {
  EXPECT_TRUE(fused_kernels());
  for (const auto& c : cases()) {
    auto out = c.call();
    ASSERT_TRUE(out.grad_fn()) << c.name;
    EXPECT_NE(out.grad_fn()->name().find(c.fused_node), std::string::npos) << c.name << ": " << out.grad_fn()->name();
  }
}

TEST(FusedKernels, OffTheOpsRunTheirReferences) {
  const seqrec::testing::ScopedFusedKernels off(false);
  for (const auto& c : cases()) {
    auto out = c.call();
    ASSERT_TRUE(out.grad_fn()) << c.name;
    EXPECT_EQ(out.grad_fn()->name().find(c.fused_node), std::string::npos) << c.name << ": " << out.grad_fn()->name();
    EXPECT_TRUE(torch::equal(out, c.reference())) << c.name;
  }
}

// --matmul_precision: the three names round-trip through ATen's context; others are refused by name.
TEST(MatmulPrecision, SetsTheContextAndRefusesUnknownNames) {
  EXPECT_EQ(matmul_precision(), "highest");
  for (const char* name : {"high", "medium", "highest"}) {
    set_matmul_precision(name);
    EXPECT_EQ(matmul_precision(), name);
  }
  try {
    set_matmul_precision("low");
    ADD_FAILURE() << "low was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'low' (known: highest, high, medium)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(matmul_precision(), "highest");
}

// Sets --matmul_precision for a scope, and "highest" again after it.
struct ScopedPrecision {
  explicit ScopedPrecision(const char* name) { set_matmul_precision(name); }
  ~ScopedPrecision() { set_matmul_precision("highest"); }
};

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// What a call returns and the gradients it sends to its inputs, for an upstream gradient drawn
// from the output's shape with a fixed seed.
std::vector<at::Tensor> value_and_grads(const std::function<at::Tensor()>& call, const std::vector<at::Tensor>& inputs) {
  for (auto t : inputs) t.mutable_grad() = at::Tensor();
  auto out = call();
  torch::manual_seed(23);
  out.backward(torch::randn_like(out));
  std::vector<at::Tensor> r{out.detach()};
  for (const auto& t : inputs) r.push_back(t.grad().clone());
  return r;
}

// "medium": a float32 product takes bfloat16 copies of its operands (float32 accumulation, the
// result rounded to bfloat16 once), gradients included; "highest" is ATen's float32 product; other
// dtypes are untouched.
TEST(MatmulPrecision, MediumRunsFloat32ProductsOnBfloat16Operands) {
  torch::manual_seed(5);
  auto x = torch::randn({3, 7, 48}).requires_grad_(), w = torch::randn({40, 48}).requires_grad_(),
       b = torch::randn({40}).requires_grad_();
  auto bf = [](const at::Tensor& t) { return t.detach().to(torch::kBFloat16); };
  EXPECT_FALSE(bf16_products(x));
  const auto full = value_and_grads([&] { return seqrec::ops::linear(x, w, b); }, {x, w, b});
  EXPECT_TRUE(torch::equal(full[0], torch::linear(x, w, b)));
  {
    const ScopedPrecision medium("medium");
    EXPECT_TRUE(bf16_products(x));
    EXPECT_FALSE(bf16_products(x.to(torch::kFloat64)));
    const auto half = value_and_grads([&] { return seqrec::ops::linear(x, w, b); }, {x, w, b});
    EXPECT_TRUE(torch::equal(half[0], torch::linear(bf(x), bf(w)).to(torch::kFloat) + b));
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(half[i].scalar_type(), torch::kFloat) << i;
      EXPECT_GT(max_rel(half[i], full[i]), 1e-5) << i << ": no bfloat16 rounding";
      EXPECT_LT(max_rel(half[i], full[i]), 2e-2) << i;
    }
    EXPECT_TRUE(torch::allclose(half[3], full[3])) << "the bias's gradient has no product";
    EXPECT_TRUE(torch::equal(seqrec::ops::linear(x, w), torch::linear(bf(x), bf(w)).to(torch::kFloat)));
    auto xd = x.detach().to(torch::kFloat64), wd = w.detach().to(torch::kFloat64);
    EXPECT_TRUE(torch::equal(seqrec::ops::linear(xd, wd), torch::linear(xd, wd)));

    auto a4 = torch::randn({2, 3, 5, 8}), b4 = torch::randn({2, 3, 8, 6});
    EXPECT_TRUE(torch::equal(seqrec::ops::matmul(a4, b4), torch::matmul(bf(a4), bf(b4)).to(torch::kFloat)));
    EXPECT_GT(max_rel(seqrec::ops::matmul(a4, b4), torch::matmul(a4, b4)), 1e-5);
    auto a2 = torch::randn({9, 48}), b2 = torch::randn({48, 5});
    auto out = torch::empty({9, 5}), acc = torch::ones({9, 5});
    seqrec::ops::mm_out(out, a2, b2);
    seqrec::ops::addmm_(acc, a2, b2);
    const auto expect = torch::mm(bf(a2), bf(b2)).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(out, expect));
    EXPECT_TRUE(torch::equal(acc, expect + 1));
  }
  auto a2 = torch::randn({9, 48}), b2 = torch::randn({48, 5});
  auto out = torch::empty({9, 5}), acc = torch::ones({9, 5});
  seqrec::ops::mm_out(out, a2, b2);
  seqrec::ops::addmm_(acc, a2, b2);
  EXPECT_TRUE(torch::equal(out, torch::mm(a2, b2)));
  EXPECT_TRUE(torch::allclose(acc, torch::mm(a2, b2) + 1));
  // A bfloat16 input (an op's output already rounded for the product) beside float32 weights takes
  // the bfloat16 product at any precision, returns float32, and its gradient is bfloat16.
  auto xb = bf(x).requires_grad_();
  const auto mixed = value_and_grads([&] { return seqrec::ops::linear(xb, w, b); }, {xb, w, b});
  EXPECT_TRUE(torch::equal(mixed[0], torch::linear(bf(x), bf(w)).to(torch::kFloat) + b));
  EXPECT_EQ(mixed[1].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(mixed[2].scalar_type(), torch::kFloat);
}

// The ops whose products the models run through ATen (softmax attention, FLASH4Rec's gated
// attention, the softmax loss) take "medium": values and gradients move by bfloat16's rounding,
// no more.
TEST(MatmulPrecision, MediumReachesTheAttentionAndLossProducts) {
  torch::manual_seed(8);
  const int64_t B = 2, L = 11, D = 16;
  auto grad = [](at::Tensor t) { return t.requires_grad_(); };
  auto q = grad(torch::randn({B, 1, L, D})), k = grad(torch::randn({B, 1, L, D})), v = grad(torch::randn({B, 1, L, D}));
  auto pad = torch::zeros({B, L}, torch::kBool);
  pad[1].narrow(0, 0, 3).fill_(true);
  const auto bias = causal_padding_bias(pad, torch::kFloat);
  // H = 1 with a per-sequence bias is the reference's one-GEMM path; H = 2 its general one.
  auto q2 = grad(torch::randn({B, 2, L, D}));
  auto hidden = grad(torch::randn({13, D})), table = grad(torch::randn({30, D}));
  auto targets = torch::randint(1, 30, {13}, torch::kLong);
  struct Named {
    const char* name;
    std::function<at::Tensor()> call;
    std::vector<at::Tensor> inputs;
  };
  const std::vector<Named> calls{
      {"softmax_attention", [&] { return causal_softmax_attention_biased(q, k, v, bias, 0.0, false); }, {q, k, v}},
      {"softmax_attention_heads",
       [&] { return causal_softmax_attention_biased(q2, q2 * 0.5, q2.flip(2), bias, 0.0, false); }, {q2}},
      {"gated_attention", [&] { return gated_attention(q, k, v, pad, GatedAttentionOptions{}); }, {q, k, v}},
      {"softmax_loss", [&] { return softmax_loss_sum(hidden, table, targets, 5, 0); }, {hidden, table}},
      {"softmax_loss_kept", [&] { return softmax_loss_sum(hidden, table, targets, 5, 1 << 20); }, {hidden, table}},
  };
  for (const auto& c : calls) {
    const auto full = value_and_grads(c.call, c.inputs);
    const ScopedPrecision medium("medium");
    const auto half = value_and_grads(c.call, c.inputs);
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_GT(max_rel(half[i], full[i]), 1e-6) << c.name << " " << i << ": no bfloat16 rounding";
      EXPECT_LT(max_rel(half[i], full[i]), 3e-2) << c.name << " " << i;
    }
  }
}

// On a CUDA device (Ampere or later) "high" reaches cuBLAS: a float32 product then carries
// TensorFloat-32's rounding (about 1e-3 relative), "highest" float32's. GPU machines only.
TEST(MatmulPrecision, HighRunsTensorFloat32ProductsOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  torch::manual_seed(3);
  auto a = torch::randn({256, 256}), b = torch::randn({256, 256});
  auto exact = torch::matmul(a.to(torch::kFloat64), b.to(torch::kFloat64));
  auto rel = [&](const at::Tensor& c) {
    return (c.cpu().to(torch::kFloat64) - exact).abs().max().item<double>() / exact.abs().max().item<double>();
  };
  const double full = rel(torch::matmul(a.cuda(), b.cuda()));
  set_matmul_precision("high");
  const double tf32 = rel(torch::matmul(a.cuda(), b.cuda()));
  set_matmul_precision("highest");
  EXPECT_LT(full, 1e-5);
  EXPECT_GT(tf32, 1e-5) << "no TensorFloat-32 rounding: is the device older than Ampere?";
  EXPECT_LT(tf32, 1e-2);
}

}  // namespace
