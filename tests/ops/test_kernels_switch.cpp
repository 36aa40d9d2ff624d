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
#include "ops/interest_attention/interest_attention.h"
#include "ops/kernels.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/lisa_attention/lisa_attention.h"
#include "ops/routing_attention/routing_attention.h"
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

// --matmul_precision: the two names round-trip through ATen's context; others are refused by name.
TEST(MatmulPrecision, SetsTheContextAndRefusesUnknownNames) {
  EXPECT_EQ(matmul_precision(), "highest");
  set_matmul_precision("high");
  EXPECT_EQ(matmul_precision(), "high");
  set_matmul_precision("highest");
  EXPECT_EQ(matmul_precision(), "highest");
  try {
    set_matmul_precision("medium");
    ADD_FAILURE() << "medium was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'medium'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(matmul_precision(), "highest");
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
