// The causal softmax attention op against a loop-level reference, on shapes that break
// tiling (length 1, odd lengths, all-padding rows), plus causality and padding isolation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "ops/kernels.h"
#include "ops/softmax_attention/softmax_attention.h"
#include "tests/ops/op_test_util.h"

namespace {

using seqrec::testing::padding_mask;

using seqrec::ops::causal_padding_bias;
using seqrec::ops::causal_softmax_attention;
using seqrec::ops::causal_softmax_attention_biased;

// Quadratic reference in double: query i attends keys j <= i that are real; a query with
// no visible key attends itself.
at::Tensor naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad) {
  auto qd = q.to(torch::kFloat64), kd = k.to(torch::kFloat64), vd = v.to(torch::kFloat64);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  auto out = torch::zeros({B, H, L, D}, torch::kFloat64);
  auto pa = pad.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> w(L, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          if (pa[b][j] && j != i) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qd[b][h][i][d].item<double>() * kd[b][h][j][d].item<double>();
          w[j] = s / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, w[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (pa[b][j] && j != i) { w[j] = 0; continue; }
          w[j] = std::exp(w[j] - mx);
          z += w[j];
        }
        for (int64_t j = 0; j <= i; ++j)
          if (w[j] > 0) out[b][h][i] += vd[b][h][j] * (w[j] / z);
      }
  return out;
}

struct Shape {
  int64_t B, H, L, D;
  std::vector<int64_t> lengths;
};

class SoftmaxAttentionShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(SoftmaxAttentionShapes, MatchesLoopReference) {
  const Shape s = GetParam();
  torch::manual_seed(7);
  auto q = torch::randn({s.B, s.H, s.L, s.D}), k = torch::randn({s.B, s.H, s.L, s.D}),
       v = torch::randn({s.B, s.H, s.L, s.D});
  auto pad = padding_mask(s.lengths, s.L);
  auto got = causal_softmax_attention(q, k, v, pad, 0.0, false).to(torch::kFloat64);
  auto want = naive(q, k, v, pad);
  // fp32 softmax over <= 150 keys against a float64 loop: 1e-5 absolute covers rounding of
  // scores of magnitude ~5 (eps 1.2e-7 x exp growth) with margin.
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxAttentionShapes,
                         ::testing::Values(Shape{1, 1, 1, 1, {1}}, Shape{2, 1, 9, 19, {9, 3}},
                                           Shape{3, 2, 7, 4, {7, 1, 0}}, Shape{1, 3, 19, 9, {5}},
                                           Shape{2, 1, 16, 8, {16, 15}},
                                           // past the row-block threshold (96): blocks of 64
                                           // rows, the last one partial
                                           Shape{2, 1, 150, 3, {150, 70}}, Shape{1, 2, 129, 2, {100}}));

TEST(SoftmaxAttention, FutureItemsDoNotChangeEarlierOutputs) {
  torch::manual_seed(1);
  const int64_t L = 11;
  auto q = torch::randn({1, 1, L, 6}), k = torch::randn({1, 1, L, 6}), v = torch::randn({1, 1, L, 6});
  auto pad = padding_mask({8}, L);
  auto base = causal_softmax_attention(q, k, v, pad, 0.0, false);
  for (int64_t t = 3; t < L; ++t) {
    auto k2 = k.clone(), v2 = v.clone(), q2 = q.clone();
    k2.select(2, t).add_(3.0);
    v2.select(2, t).add_(-2.0);
    q2.select(2, t).mul_(5.0);
    auto out = causal_softmax_attention(q2, k2, v2, pad, 0.0, false);
    EXPECT_TRUE(torch::equal(out.narrow(2, 0, t), base.narrow(2, 0, t))) << "changing slot " << t;
  }
}

TEST(SoftmaxAttention, PaddedSlotsDoNotChangeRealOutputs) {
  torch::manual_seed(2);
  const int64_t L = 10;
  auto q = torch::randn({2, 2, L, 4}), k = torch::randn({2, 2, L, 4}), v = torch::randn({2, 2, L, 4});
  auto pad = padding_mask({6, 1}, L);
  auto base = causal_softmax_attention(q, k, v, pad, 0.0, false);
  auto k2 = k.clone(), v2 = v.clone();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < L; ++j)
      if (pad[b][j].item<bool>()) {
        k2[b].select(1, j).fill_(100.0);
        v2[b].select(1, j).fill_(-50.0);
      }
  auto out = causal_softmax_attention(q, k2, v2, pad, 0.0, false);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < L; ++j)
      if (!pad[b][j].item<bool>()) {
        EXPECT_TRUE(torch::equal(out[b].select(1, j), base[b].select(1, j)));
      }
}

TEST(SoftmaxAttention, GradientsFlowAndAreFinite) {
  torch::manual_seed(3);
  auto q = torch::randn({2, 1, 5, 3}, torch::requires_grad()), k = torch::randn({2, 1, 5, 3}, torch::requires_grad()),
       v = torch::randn({2, 1, 5, 3}, torch::requires_grad());
  auto pad = padding_mask({5, 2}, 5);
  causal_softmax_attention(q, k, v, pad, 0.0, true).sum().backward();
  for (auto* t : {&q, &k, &v}) EXPECT_TRUE(torch::isfinite(t->grad()).all().item<bool>());
}

// q and k shared by the batch ([1, H, L, D], LightSANs' positions-only scores) give what the
// same q and k expanded to every sequence give, values and all three gradients, at float32
// (one L x L product) and at bfloat16 products (expanded there). The expanded run's gradients of
// q and k are sums over the batch of per-sequence products, the shared run's one product of
// summed score gradients: rounding apart, so 1e-5 of the largest entry (float32) and, at
// medium, 2^-6 of it (the score gradients are bfloat16 on both sides and the shared side sums
// them in bfloat16 before its product: a few bfloat16 roundings; seen 2^-7.5).
TEST(SoftmaxAttention, ScoresSharedByTheBatchMatchExpandedOnes) {
  for (const char* precision : {"highest", "medium"}) {
    seqrec::ops::set_matmul_precision(precision);
    const double tol = std::string(precision) == "highest" ? 1e-5 : 1.0 / 64;
    for (int64_t H : {1, 2}) {
      SCOPED_TRACE(std::string(precision) + " H=" + std::to_string(H));
      torch::manual_seed(11 + H);
      const int64_t B = 4, L = 9, D = 6;
      auto q0 = torch::randn({1, H, L, D}), k0 = torch::randn({1, H, L, D}), v0 = torch::randn({B, H, L, D});
      auto bias = causal_padding_bias(padding_mask({9, 4, 1, 0}, L), torch::kFloat);
      auto g = torch::randn({B, H, L, D});
      auto run = [&](bool expand) {
        auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
        auto qe = expand ? q.expand({B, H, L, D}) : q, ke = expand ? k.expand({B, H, L, D}) : k;
        auto out = causal_softmax_attention_biased(qe, ke, v, bias, 0.0, false);
        (out * g).sum().backward();
        return std::vector<at::Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
      };
      auto shared = run(false), expanded = run(true);
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (int i = 0; i < 4; ++i) {
        ASSERT_EQ(shared[i].sizes(), expanded[i].sizes()) << names[i];
        const double scale = expanded[i].abs().max().item<double>();
        EXPECT_LE((shared[i] - expanded[i]).abs().max().item<double>(), tol * scale) << names[i];
      }
    }
  }
  seqrec::ops::set_matmul_precision("highest");
}

TEST(SoftmaxAttention, RejectsBadShapes) {
  auto q = torch::randn({1, 1, 4, 2});
  EXPECT_THROW(causal_softmax_attention(q, q, q, torch::zeros({1, 5}, torch::kBool), 0, false), c10::Error);
  EXPECT_THROW(causal_softmax_attention(q, q, torch::randn({1, 1, 3, 2}), torch::zeros({1, 4}, torch::kBool), 0, false),
               c10::Error);
  // q and k must have one shape (a batch of 1 or v's); a bias's batch must be v's or 1.
  auto v = torch::randn({3, 1, 4, 2});
  auto bias = causal_padding_bias(torch::zeros({3, 4}, torch::kBool), torch::kFloat);
  EXPECT_THROW(causal_softmax_attention_biased(q, q.expand({3, 1, 4, 2}), v, bias, 0, false), c10::Error);
  EXPECT_THROW(causal_softmax_attention_biased(q, q, v, bias.narrow(0, 0, 2), 0, false), c10::Error);
  EXPECT_THROW(causal_softmax_attention_biased(torch::randn({2, 1, 4, 2}), torch::randn({2, 1, 4, 2}), v, bias, 0, false),
               c10::Error);
}

}  // namespace
