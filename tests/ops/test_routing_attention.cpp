// Causal balanced routing, routed attention and local attention against loop-level references in
// double, on shapes that break the chunk tiling (length 1, odd lengths, lengths that are not a
// multiple of the chunk, chunk 1, chunk >= length, windows wider than the prefix, window 1, all-
// padding rows, left and right padding); causality, padding isolation, left-padding invariance,
// gradients, the full-window limit, dropout and named errors. routed_attention is the fused CPU
// kernel here; it is also checked against routed_attention_reference (outputs, gradients, the
// dropout mask under one generator state).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ops/dropout/dropout.h"
#include "ops/routing_attention/routing_attention.h"
#include "ops/routing_attention/routing_attention_kernel.h"
#include "ops/softmax_attention/softmax_attention.h"
#include "tests/ops/op_test_util.h"

namespace {

using seqrec::ops::causal_balanced_routing;
using seqrec::ops::local_attention;
using seqrec::ops::routed_attention;
using seqrec::ops::routed_attention_reference;
using seqrec::ops::RoutingPlan;
using seqrec::testing::expect_error;
using seqrec::testing::max_err;
using seqrec::testing::padding_mask;

const auto kF64 = torch::kFloat64;

// The plan by the header's definition: per (b, h, i), the cluster and the ascending key slots.
struct NaivePlan {
  int64_t B, H, L;
  std::vector<int64_t> cluster;
  std::vector<std::vector<int64_t>> window;
  int64_t at(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * L + i; }
};

NaivePlan naive_plan(const at::Tensor& r, const at::Tensor& mu, const at::Tensor& pad, int64_t W, int64_t S) {
  const int64_t B = r.size(0), H = r.size(1), L = r.size(2), D = r.size(3), K = mu.size(1);
  auto R = r.accessor<double, 4>();
  auto M = mu.accessor<double, 3>();
  auto P = pad.accessor<bool, 2>();
  NaivePlan plan{B, H, L, std::vector<int64_t>(B * H * L), std::vector<std::vector<int64_t>>(B * H * L)};
  std::vector<std::vector<double>> score(L, std::vector<double>(K));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < K; ++c) {
          score[i][c] = 0;
          for (int64_t d = 0; d < D; ++d) score[i][c] += R[b][h][i][d] * M[h][c][d];
        }
      for (int64_t i = 0; i < L; ++i) {
        int64_t c = 0;
        for (int64_t k = 1; k < K; ++k)
          if (score[i][k] > score[i][c]) c = k;
        const int64_t start = std::max<int64_t>(0, L - S * ((L - 1 - i) / S + 1));
        std::vector<int64_t> cand;
        for (int64_t j = 0; j < start; ++j)
          if (!P[b][j]) cand.push_back(j);
        std::sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return score[x][c] > score[y][c]; });
        if (static_cast<int64_t>(cand.size()) > W) cand.resize(W);
        std::sort(cand.begin(), cand.end());
        plan.cluster[plan.at(b, h, i)] = c;
        plan.window[plan.at(b, h, i)] = cand;
      }
    }
  return plan;
}

// The op's window of (b, h, i) as an ascending list of its valid slots.
std::vector<int64_t> op_window(const RoutingPlan& plan, int64_t b, int64_t h, int64_t i) {
  std::vector<int64_t> out;
  for (int64_t w = 0; w < plan.window.size(3); ++w)
    if (plan.valid[b][h][i][w].item<bool>()) out.push_back(plan.window[b][h][i][w].item<int64_t>());
  std::sort(out.begin(), out.end());
  return out;
}

// out[i] = sum over keys j of exp(l_j - max) / z · v[j], by hand; padded queries give 0.
void attend(const std::vector<int64_t>& keys, const std::vector<double>& logits, const at::TensorAccessor<double, 2>& V,
            at::TensorAccessor<double, 1> out) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double l : logits) z += std::exp(l - mx);
  for (size_t n = 0; n < keys.size(); ++n)
    for (int64_t e = 0; e < out.size(0); ++e) out[e] += std::exp(logits[n] - mx) / z * V[keys[n]][e];
}

at::Tensor naive_routed(const at::Tensor& r, const at::Tensor& v, const NaivePlan& plan, const at::Tensor& pad,
                        double scale) {
  const int64_t B = r.size(0), H = r.size(1), L = r.size(2), D = r.size(3);
  auto R = r.accessor<double, 4>();
  auto V = v.accessor<double, 4>();
  auto P = pad.accessor<bool, 2>();
  auto out = torch::zeros({B, H, L, v.size(3)}, kF64);
  auto O = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        if (P[b][i]) continue;
        auto keys = plan.window[plan.at(b, h, i)];
        keys.push_back(i);
        std::vector<double> logits;
        for (int64_t j : keys) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += R[b][h][i][d] * R[b][h][j][d];
          logits.push_back(scale * s);
        }
        attend(keys, logits, V[b][h], O[b][h][i]);
      }
  return out;
}

at::Tensor naive_local(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
                       int64_t window) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  auto Q = q.accessor<double, 4>();
  auto Kc = k.accessor<double, 4>();
  auto V = v.accessor<double, 4>();
  auto P = pad.accessor<bool, 2>();
  auto out = torch::zeros({B, H, L, D}, kF64);
  auto O = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        if (P[b][i]) continue;
        std::vector<int64_t> keys;
        std::vector<double> logits;
        for (int64_t j = std::max<int64_t>(0, i - window + 1); j <= i; ++j) {
          if (P[b][j]) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += Q[b][h][i][d] * Kc[b][h][j][d];
          keys.push_back(j);
          logits.push_back(s / std::sqrt(static_cast<double>(D)));
        }
        attend(keys, logits, V[b][h], O[b][h][i]);
      }
  return out;
}

struct Case {
  int64_t B, H, L, D, K, W, S;
  std::vector<int64_t> lengths;
  bool left;
};

std::vector<Case> shape_cases() {
  return {
      {1, 1, 1, 2, 2, 1, 1, {1}, true},            // L = 1
      {1, 1, 1, 2, 2, 3, 4, {0}, true},            // L = 1, all padding
      {2, 2, 13, 3, 3, 2, 4, {13, 7}, true},       // odd L, not a multiple of S: partial first chunk
      {2, 1, 9, 4, 2, 3, 1, {9, 5}, false},        // S = 1, right padding
      {1, 2, 7, 3, 2, 2, 7, {7}, true},            // S = L: one chunk, empty windows
      {2, 2, 7, 3, 2, 2, 10, {7, 4}, false},       // S > L
      {2, 3, 17, 4, 3, 20, 3, {17, 0}, true},      // W wider than any prefix, an all-padding row
      {3, 2, 20, 5, 4, 1, 5, {20, 11, 2}, false},  // W = 1
      {2, 2, 50, 6, 5, 5, 7, {50, 33}, true},
      {2, 1, 64, 8, 8, 8, 8, {64, 40}, false},
  };
}

std::string describe(const Case& c) {
  return "L=" + std::to_string(c.L) + " H=" + std::to_string(c.H) + " W=" + std::to_string(c.W) + " S=" +
         std::to_string(c.S) + (c.left ? " left" : " right");
}

TEST(RoutingAttention, MatchesLoopReferences) {
  torch::manual_seed(21);
  for (const auto& c : shape_cases()) {
    auto r = torch::randn({c.B, c.H, c.L, c.D}, kF64), v = torch::randn({c.B, c.H, c.L, c.D + 1}, kF64);
    auto mu = torch::randn({c.H, c.K, c.D}, kF64);
    auto pad = padding_mask(c.lengths, c.L, c.left);
    const std::string where = describe(c);

    auto plan = causal_balanced_routing(r, mu, pad, c.W, c.S);
    ASSERT_EQ(plan.cluster.sizes(), (std::vector<int64_t>{c.B, c.H, c.L})) << where;
    ASSERT_EQ(plan.window.sizes(), (std::vector<int64_t>{c.B, c.H, c.L, c.W})) << where;
    ASSERT_EQ(plan.valid.sizes(), plan.window.sizes()) << where;
    EXPECT_EQ(plan.window.masked_select(plan.valid.logical_not()).abs().sum().item<int64_t>(), 0) << where;
    auto want = naive_plan(r, mu, pad, c.W, c.S);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < c.L; ++i) {
          EXPECT_EQ(plan.cluster[b][h][i].item<int64_t>(), want.cluster[want.at(b, h, i)]) << where << " i=" << i;
          EXPECT_EQ(op_window(plan, b, h, i), want.window[want.at(b, h, i)]) << where << " b=" << b << " i=" << i;
        }

    const double scale = 0.7;
    auto got = routed_attention(r, v, plan, pad, scale, 0.0, false);
    auto ref = naive_routed(r, v, want, pad, scale);
    EXPECT_LT(max_err(got, ref), 1e-10) << where;
    EXPECT_LT(max_err(routed_attention_reference(r, v, plan, pad, scale, 0.0, false), ref), 1e-10) << where;

    for (int64_t window : {int64_t{1}, int64_t{2}, int64_t{3}, c.L, c.L + 4}) {
      auto q = torch::randn({c.B, c.H, c.L, c.D}, kF64), k = torch::randn({c.B, c.H, c.L, c.D}, kF64),
           vl = torch::randn({c.B, c.H, c.L, c.D}, kF64);
      auto out = local_attention(q, k, vl, pad, window, 0.0, false);
      EXPECT_LT(max_err(out, naive_local(q, k, vl, pad, window)), 1e-10) << where << " local window=" << window;
    }
  }
}

TEST(RoutingAttention, EmptySequences) {
  auto r = torch::randn({2, 3, 0, 4}, kF64);
  auto pad = torch::zeros({2, 0}, torch::kBool);
  auto plan = causal_balanced_routing(r, torch::randn({3, 2, 4}, kF64), pad, 3, 2);
  EXPECT_EQ(plan.window.sizes(), (std::vector<int64_t>{2, 3, 0, 3}));
  EXPECT_EQ(routed_attention(r, r, plan, pad, 1.0, 0.0, false).sizes(), r.sizes());
  EXPECT_EQ(local_attention(r, r, r, pad, 3, 0.0, false).sizes(), r.sizes());
}

// The fused kernel against the ATen reference: outputs and gradients w.r.t. r and v, in double
// (to 1e-10) and float (to 1e-5, gradients relative to their largest entry when above 1), with v
// a strided view as the model passes it. In double also at a large scale (logits in the
// hundreds: the softmax must stay stable); float logits that large differ by more than 1e-5
// between any two summation orders.
TEST(RoutingAttention, FusedMatchesReference) {
  torch::manual_seed(28);
  for (const auto& c : shape_cases())
    for (double scale : {0.7, 40.0}) {
      auto r64 = torch::randn({c.B, c.H, c.L, c.D}, kF64);
      auto v64 = torch::randn({c.B, c.L, c.H, c.D + 1}, kF64).transpose(1, 2);
      auto g64 = torch::randn({c.B, c.H, c.L, c.D + 1}, kF64);
      auto pad = padding_mask(c.lengths, c.L, c.left);
      auto plan = causal_balanced_routing(r64, torch::randn({c.H, c.K, c.D}, kF64), pad, c.W, c.S);
      for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
        if (dtype == torch::kFloat32 && scale > 1) continue;
        const double tol = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
        const std::string where = describe(c) + " scale=" + std::to_string(scale) +
                                  (dtype == torch::kFloat64 ? " double" : " float");
        auto r = r64.to(dtype).requires_grad_(), v = v64.to(dtype).requires_grad_();
        auto g = g64.to(dtype);
        auto got = routed_attention(r, v, plan, pad, scale, 0.0, false);
        auto want = routed_attention_reference(r, v, plan, pad, scale, 0.0, false);
        ASSERT_EQ(got.sizes(), want.sizes()) << where;
        ASSERT_EQ(got.scalar_type(), dtype) << where;
        EXPECT_LT(max_err(got, want), tol) << where;
        auto got_grad = torch::autograd::grad({(got * g).sum()}, {r, v});
        auto want_grad = torch::autograd::grad({(want * g).sum()}, {r, v});
        for (int n = 0; n < 2; ++n) {
          const double size = std::max(1.0, want_grad[n].abs().max().item<double>());
          EXPECT_LT(max_err(got_grad[n], want_grad[n]) / (dtype == torch::kFloat64 ? 1.0 : size), tol)
              << where << (n == 0 ? " grad r" : " grad v");
        }
      }
    }
}

// The CUDA kernels' row functions (routing_attention_kernel.h) on the CPU with an emulated warp:
// out and the gradients of r and v for the output gradient g, given the dropout keep mask (or
// none). out, probs and dl start as NaN, so a slot the kernels leave unwritten shows.
template <typename T>
std::vector<at::Tensor> emulated_routed(const at::Tensor& r_in, const at::Tensor& v_in, const RoutingPlan& plan,
                                        const at::Tensor& pad_in, double scale, const at::Tensor& mask_in,
                                        const at::Tensor& g_in) {
  namespace rk = seqrec::ops::cuda::routing_kernel;
  auto r = r_in.contiguous(), v = v_in.contiguous(), g = g_in.contiguous(), pad = pad_in.contiguous();
  auto window = plan.window.contiguous(), valid = plan.valid.contiguous();
  at::Tensor mask = mask_in.defined() ? mask_in.contiguous() : at::Tensor();
  const int64_t B = r.size(0), H = r.size(1), L = r.size(2), W = window.size(3);
  auto out = torch::full({B, H, L, v.size(3)}, std::nan(""), v.options());
  auto probs = torch::full({B, H, L, W + 1}, std::nan(""), r.options());
  auto dl = torch::full({B, H, L, W + 1}, std::nan(""), r.options());
  auto gr = torch::zeros_like(r), gv = torch::zeros_like(v);
  rk::Args<T> a{};
  a.r = r.data_ptr<T>();
  a.v = v.data_ptr<T>();
  a.window = window.data_ptr<int64_t>();
  a.valid = valid.data_ptr<bool>();
  a.pad = pad.data_ptr<bool>();
  a.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
  a.out = out.data_ptr<T>();
  a.probs = probs.data_ptr<T>();
  a.grad = g.data_ptr<T>();
  a.gr = gr.data_ptr<T>();
  a.gv = gv.data_ptr<T>();
  a.dl = dl.data_ptr<T>();
  a.B = B;
  a.H = H;
  a.L = L;
  a.W = W;
  a.d = r.size(3);
  a.dv = v.size(3);
  a.scale = static_cast<T>(scale);
  rk::emulate(a, /*backward=*/false);
  EXPECT_FALSE(torch::isnan(out).any().item<bool>() || torch::isnan(probs).any().item<bool>())
      << "a slot left unwritten";
  rk::emulate(a, /*backward=*/true);
  return {out, gr, gv};
}

// Against the CPU's fused kernel, in double and float, over the shape cases (padding either side,
// all-padding rows, windows wider than the prefix, W = 1), features wider than a warp (d 40,
// dv 70 and 33: lanes holding one and several features), and under dropout with the mask the
// fused kernel draws. What this cannot show (the device's shuffles, atomics, launch errors) is
// CudaKernelMatchesCpuKernel's, on a GPU.
TEST(RoutingAttention, CudaKernelLogicMatchesCpuKernel) {
  torch::manual_seed(31);
  auto cases = shape_cases();
  cases.push_back({2, 2, 40, 40, 3, 6, 5, {40, 23}, true});
  for (const auto& c : cases)
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (double p : {0.0, 0.3}) {
        const int64_t dv = c.D == 40 ? 70 : c.D + 1;
        auto r = torch::randn({c.B, c.H, c.L, c.D}, dtype).requires_grad_();
        auto v = torch::randn({c.B, c.H, c.L, dv}, dtype).requires_grad_();
        auto g = torch::randn({c.B, c.H, c.L, dv}, dtype);
        auto pad = padding_mask(c.lengths, c.L, c.left);
        auto plan = causal_balanced_routing(r.detach(), torch::randn({c.H, c.K, c.D}, dtype), pad, c.W, c.S);
        at::Tensor mask;
        torch::manual_seed(7);
        if (p > 0) {
          mask = seqrec::ops::dropout_mask(torch::empty({c.B, c.H, c.L, c.W + 1}, dtype), p,
                                           seqrec::ops::random_seed());
          torch::manual_seed(7);  // the fused op draws the same seed
        }
        auto want = routed_attention(r, v, plan, pad, 0.6, p, p > 0);
        auto g_want = torch::autograd::grad({want}, {r, v}, {g});
        auto got = dtype == torch::kFloat64 ? emulated_routed<double>(r.detach(), v.detach(), plan, pad, 0.6, mask, g)
                                            : emulated_routed<float>(r.detach(), v.detach(), plan, pad, 0.6, mask, g);
        const std::string where = describe(c) + (dtype == torch::kFloat64 ? " double" : " float") +
                                  " dropout " + std::to_string(p);
        // Float: the kernel's dot products are lane sums and butterflies, the CPU kernel's eight
        // running partial sums; over d <= 40 terms both are within a few ulp of the largest value.
        const double tol = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
        auto close = [&](const at::Tensor& a, const at::Tensor& b) {
          return torch::isfinite(a).all().item<bool>() &&
                 max_err(a, b) <= tol * std::max(1.0, b.abs().max().item<double>());
        };
        EXPECT_TRUE(close(got[0], want.detach())) << where << " out, max err " << max_err(got[0], want);
        EXPECT_TRUE(close(got[1], g_want[0])) << where << " grad r, max err " << max_err(got[1], g_want[0]);
        EXPECT_TRUE(close(got[2], g_want[1])) << where << " grad v, max err " << max_err(got[2], g_want[1]);
      }
}

// The CUDA kernels (what routed_attention runs on a CUDA device) against the CPU's fused kernel
// on the same inputs and plan: values and both gradients, float and double, the shape cases
// and a wider one, and dropout under one generator state (the same mask on both devices). GPU
// machines only.
TEST(RoutingAttention, CudaKernelMatchesCpuKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  torch::manual_seed(32);
  auto cases = shape_cases();
  cases.push_back({16, 2, 200, 25, 14, 15, 15, {200, 120, 7, 0}, true});
  for (const auto& c : cases)
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (double p : {0.0, 0.3}) {
        auto r = torch::randn({c.B, c.H, c.L, c.D}, dtype);
        auto v = torch::randn({c.B, c.H, c.L, c.D + 1}, dtype);
        auto g = torch::randn({c.B, c.H, c.L, c.D + 1}, dtype);
        std::vector<int64_t> lengths = c.lengths;
        lengths.resize(c.B, c.L);
        auto pad = padding_mask(lengths, c.L, c.left);
        auto plan = causal_balanced_routing(r, torch::randn({c.H, c.K, c.D}, dtype), pad, c.W, c.S);
        auto run_on = [&](const torch::Device& device) {
          auto rd = r.to(device).requires_grad_(), vd = v.to(device).requires_grad_();
          RoutingPlan pd{plan.cluster.to(device), plan.window.to(device), plan.valid.to(device)};
          torch::manual_seed(7);
          auto out = routed_attention(rd, vd, pd, pad.to(device), 0.6, p, p > 0);
          auto grads = torch::autograd::grad({out}, {rd, vd}, {g.to(device)});
          return std::make_pair(out, grads);
        };
        auto [want, g_want] = run_on(torch::kCPU);
        auto [got, g_got] = run_on(torch::kCUDA);
        const std::string where = describe(c) + (dtype == torch::kFloat64 ? " double" : " float") +
                                  " dropout " + std::to_string(p);
        ASSERT_TRUE(got.is_cuda()) << where;
        EXPECT_NE(got.grad_fn()->name().find("RoutedAttention"), std::string::npos)
            << where << ": " << got.grad_fn()->name();
        // As in the emulation, plus the device's atomic adds into the shared key rows, whose
        // order varies from run to run.
        const double tol = dtype == torch::kFloat64 ? 1e-10 : 2e-5;
        auto close = [&](const at::Tensor& a, const at::Tensor& b) {
          return max_err(a.cpu(), b) <= tol * std::max(1.0, b.abs().max().item<double>());
        };
        EXPECT_TRUE(close(got, want)) << where << " out";
        EXPECT_TRUE(close(g_got[0], g_want[0])) << where << " grad r";
        EXPECT_TRUE(close(g_got[1], g_want[1])) << where << " grad v";
      }
}

// Under one generator state the fused kernel draws the reference's seed and mask: equal outputs
// and gradients, and the generator left in the same state. Central differences through the
// dropped probabilities (generator reset before each evaluation).
TEST(RoutingAttention, FusedDropoutMatchesReference) {
  torch::manual_seed(29);
  const int64_t B = 3, H = 2, L = 21, D = 4, W = 3, S = 4;
  const double p = 0.3;
  auto pad = padding_mask({L, 13, 0}, L, true);
  auto r = torch::randn({B, H, L, D}, kF64).requires_grad_(), v = torch::randn({B, H, L, D + 1}, kF64).requires_grad_();
  auto g = torch::randn({B, H, L, D + 1}, kF64);
  auto plan = causal_balanced_routing(r.detach(), torch::randn({H, 3, D}, kF64), pad, W, S);
  torch::manual_seed(7);
  auto got = routed_attention(r, v, plan, pad, 0.6, p, true);
  auto got_next = torch::rand({4}, kF64);
  torch::manual_seed(7);
  auto want = routed_attention_reference(r, v, plan, pad, 0.6, p, true);
  auto want_next = torch::rand({4}, kF64);
  EXPECT_TRUE(torch::equal(got_next, want_next));
  EXPECT_LT(max_err(got, want), 1e-12);
  EXPECT_GT(max_err(got, routed_attention(r, v, plan, pad, 0.6, 0.0, false)), 1e-3);  // the mask drops something
  auto got_grad = torch::autograd::grad({(got * g).sum()}, {r, v});
  auto want_grad = torch::autograd::grad({(want * g).sum()}, {r, v});
  EXPECT_LT(max_err(got_grad[0], want_grad[0]), 1e-10);
  EXPECT_LT(max_err(got_grad[1], want_grad[1]), 1e-10);

  // Float: the same mask, so equal to rounding.
  auto rf = r.detach().to(torch::kFloat32), vf = v.detach().to(torch::kFloat32);
  torch::manual_seed(8);
  auto got_f = routed_attention(rf, vf, plan, pad, 0.6, p, true);
  torch::manual_seed(8);
  EXPECT_LT(max_err(got_f, routed_attention_reference(rf, vf, plan, pad, 0.6, p, true)), 1e-5);

  auto f = [&] {
    torch::manual_seed(9);
    return (routed_attention(r, v, plan, pad, 0.6, p, true) * g).sum();
  };
  seqrec::testing::expect_gradients_match_central_differences(f, {r, v}, 2);
}

TEST(RoutingAttention, FutureSlotsChangeNoEarlierOutput) {
  torch::manual_seed(22);
  const int64_t B = 2, H = 2, L = 23, D = 4, K = 3, W = 3, S = 4;
  auto pad = padding_mask({L, 15}, L, true);
  auto r = torch::randn({B, H, L, D}, kF64), v = torch::randn({B, H, L, D}, kF64);
  auto q = torch::randn({B, H, L, D}, kF64), k = torch::randn({B, H, L, D}, kF64);
  auto mu = torch::randn({H, K, D}, kF64);
  auto plan = causal_balanced_routing(r, mu, pad, W, S);
  auto routed = routed_attention(r, v, plan, pad, 0.5, 0.0, false);
  auto local = local_attention(q, k, v, pad, 5, 0.0, false);
  for (int64_t t : {0, 5, 8, 11, 19, 20, 22}) {
    auto r2 = r.clone(), v2 = v.clone(), q2 = q.clone(), k2 = k.clone();
    for (auto* x : {&r2, &v2, &q2, &k2}) x->select(2, t).normal_(0.0, 3.0);
    auto plan2 = causal_balanced_routing(r2, mu, pad, W, S);
    auto routed2 = routed_attention(r2, v2, plan2, pad, 0.5, 0.0, false);
    auto local2 = local_attention(q2, k2, v2, pad, 5, 0.0, false);
    EXPECT_TRUE(torch::equal(plan2.cluster.narrow(2, 0, t), plan.cluster.narrow(2, 0, t))) << "slot " << t;
    EXPECT_TRUE(torch::equal(plan2.window.narrow(2, 0, t), plan.window.narrow(2, 0, t))) << "slot " << t;
    EXPECT_TRUE(torch::equal(plan2.valid.narrow(2, 0, t), plan.valid.narrow(2, 0, t))) << "slot " << t;
    EXPECT_TRUE(torch::equal(routed2.narrow(2, 0, t), routed.narrow(2, 0, t))) << "slot " << t;
    EXPECT_TRUE(torch::equal(local2.narrow(2, 0, t), local.narrow(2, 0, t))) << "slot " << t;
    // Slot t itself (real in row 0) does change: the test would pass vacuously otherwise.
    EXPECT_FALSE(torch::equal(routed2[0].select(1, t), routed[0].select(1, t))) << "slot " << t;
    EXPECT_FALSE(torch::equal(local2[0].select(1, t), local[0].select(1, t))) << "slot " << t;
  }
}

TEST(RoutingAttention, PaddedSlotsChangeNoRealOutput) {
  torch::manual_seed(23);
  const int64_t B = 3, H = 2, L = 19, D = 4, K = 3, W = 4, S = 3;
  for (bool left : {true, false}) {
    auto pad = padding_mask({L, 12, 3}, L, left);
    auto real = pad.logical_not().view({B, 1, L, 1});
    auto r = torch::randn({B, H, L, D}, kF64), v = torch::randn({B, H, L, D}, kF64);
    auto q = torch::randn({B, H, L, D}, kF64), k = torch::randn({B, H, L, D}, kF64);
    auto mu = torch::randn({H, K, D}, kF64);
    auto scramble = [&](const at::Tensor& x) {
      return torch::where(pad.view({B, 1, L, 1}), 100.0 * torch::rand_like(x), x);
    };
    auto plan = causal_balanced_routing(r, mu, pad, W, S);
    auto plan2 = causal_balanced_routing(scramble(r), mu, pad, W, S);
    EXPECT_TRUE(torch::equal(plan.window.masked_select(real), plan2.window.masked_select(real)));
    EXPECT_TRUE(torch::equal(plan.valid.masked_select(real), plan2.valid.masked_select(real)));
    // No window holds a padded slot.
    auto key_pad = pad.view({B, 1, 1, L}).expand({B, H, L, L}).gather(3, plan.window);
    EXPECT_FALSE(key_pad.logical_and(plan.valid).any().item<bool>()) << "left=" << left;

    auto routed = routed_attention(r, v, plan, pad, 0.5, 0.0, false);
    auto routed2 = routed_attention(scramble(r), scramble(v), plan2, pad, 0.5, 0.0, false);
    EXPECT_TRUE(torch::equal(routed.masked_select(real), routed2.masked_select(real))) << "left=" << left;
    auto local = local_attention(q, k, v, pad, 4, 0.0, false);
    auto local2 = local_attention(scramble(q), scramble(k), scramble(v), pad, 4, 0.0, false);
    EXPECT_TRUE(torch::equal(local.masked_select(real), local2.masked_select(real))) << "left=" << left;
    // Padded slots output exactly 0.
    for (const auto& out : {routed2, local2})
      EXPECT_EQ(out.masked_fill(real, 0.0).abs().max().item<double>(), 0.0) << "left=" << left;
  }
}

TEST(RoutingAttention, LeftPaddingChangesNoRealOutput) {
  torch::manual_seed(24);
  const int64_t B = 2, H = 2, L = 15, D = 3, K = 3, W = 3, S = 4, P = 5;
  for (bool left : {true, false}) {
    auto pad = padding_mask({L, 9}, L, left);
    auto r = torch::randn({B, H, L, D}, kF64), v = torch::randn({B, H, L, D}, kF64);
    auto q = torch::randn({B, H, L, D}, kF64), k = torch::randn({B, H, L, D}, kF64);
    auto mu = torch::randn({H, K, D}, kF64);
    auto grow = [&](const at::Tensor& x) { return torch::cat({torch::randn({B, H, P, D}, kF64), x}, 2); };
    auto pad2 = torch::cat({torch::ones({B, P}, torch::kBool), pad}, 1);
    auto real = pad.logical_not().view({B, 1, L, 1});

    auto plan = causal_balanced_routing(r, mu, pad, W, S);
    auto r2 = grow(r);
    auto plan2 = causal_balanced_routing(r2, mu, pad2, W, S);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i) {
          if (pad[b][i].item<bool>()) continue;
          auto shifted = op_window(plan, b, h, i);
          for (auto& j : shifted) j += P;
          EXPECT_EQ(op_window(plan2, b, h, i + P), shifted) << "left=" << left << " b=" << b << " i=" << i;
        }
    auto routed = routed_attention(r, v, plan, pad, 0.5, 0.0, false);
    auto routed2 = routed_attention(r2, grow(v), plan2, pad2, 0.5, 0.0, false).narrow(2, P, L);
    EXPECT_LT(max_err(routed.masked_fill(real.logical_not(), 0.0), routed2.masked_fill(real.logical_not(), 0.0)),
              1e-12)
        << "left=" << left;
    for (int64_t window : {3, 15, 40}) {
      auto local = local_attention(q, k, v, pad, window, 0.0, false);
      auto local2 = local_attention(grow(q), grow(k), grow(v), pad2, window, 0.0, false).narrow(2, P, L);
      EXPECT_LT(max_err(local.masked_fill(real.logical_not(), 0.0), local2.masked_fill(real.logical_not(), 0.0)),
                1e-12)
          << "left=" << left << " window=" << window;
    }
  }
}

// Autograd against central differences, and exactly zero gradient at padded slots' inputs.
TEST(RoutingAttention, GradientsMatchCentralDifferences) {
  torch::manual_seed(25);
  const int64_t B = 2, H = 2, L = 9, D = 3, K = 2;
  for (bool left : {true, false}) {
    auto pad = padding_mask({L, 5}, L, left);
    auto at_pad = [&](const at::Tensor& g) {
      return g.masked_select(pad.view({B, 1, L, 1}).expand_as(g)).abs().max().item<double>();
    };
    auto r = torch::randn({B, H, L, D}, kF64).requires_grad_(), v = torch::randn({B, H, L, D + 1}, kF64).requires_grad_();
    auto plan = causal_balanced_routing(r.detach(), torch::randn({H, K, D}, kF64), pad, 2, 3);
    auto g = torch::randn({B, H, L, D + 1}, kF64);
    auto routed = [&] { return (routed_attention(r, v, plan, pad, 0.6, 0.0, false) * g).sum(); };
    seqrec::testing::expect_gradients_match_central_differences(routed, {r, v});
    auto gr = torch::autograd::grad({routed()}, {r, v});
    EXPECT_EQ(at_pad(gr[0]), 0.0) << "left=" << left;
    EXPECT_EQ(at_pad(gr[1]), 0.0) << "left=" << left;
    EXPECT_GT(gr[0].abs().max().item<double>(), 0.0);

    auto q = torch::randn({B, H, L, D}, kF64).requires_grad_(), k = torch::randn({B, H, L, D}, kF64).requires_grad_(),
         vl = torch::randn({B, H, L, D}, kF64).requires_grad_();
    auto gl = torch::randn({B, H, L, D}, kF64);
    auto local = [&] { return (local_attention(q, k, vl, pad, 3, 0.0, false) * gl).sum(); };
    seqrec::testing::expect_gradients_match_central_differences(local, {q, k, vl});
    auto gq = torch::autograd::grad({local()}, {q, k, vl});
    for (int n = 0; n < 3; ++n) EXPECT_EQ(at_pad(gq[n]), 0.0) << "left=" << left << " input " << n;
  }
}

TEST(RoutingAttention, FullWindowLocalEqualsCausalSoftmax) {
  torch::manual_seed(26);
  for (int64_t L : {1, 6, 13})
    for (bool left : {true, false})
      for (int64_t extra : {0, 3}) {
        auto pad = padding_mask({L, (L + 1) / 2, 0}, L, left);
        auto q = torch::randn({3, 2, L, 4}, kF64), k = torch::randn({3, 2, L, 4}, kF64),
             v = torch::randn({3, 2, L, 4}, kF64);
        auto got = local_attention(q, k, v, pad, L + extra, 0.0, false);
        auto want = seqrec::ops::causal_softmax_attention(q, k, v, pad, 0.0, false)
                        .masked_fill(pad.view({3, 1, L, 1}), 0.0);
        EXPECT_LT(max_err(got, want), 1e-10) << "L=" << L << " left=" << left << " window=" << L + extra;
      }
}

TEST(RoutingAttention, DropoutIsIdentityAtZeroAndReproducible) {
  torch::manual_seed(27);
  const int64_t B = 2, H = 2, L = 16, D = 4;
  auto pad = padding_mask({L, 10}, L, true);
  auto r = torch::randn({B, H, L, D}), v = torch::randn({B, H, L, D});
  auto plan = causal_balanced_routing(r, torch::randn({H, 3, D}), pad, 4, 4);
  auto routed = [&](double p, bool training) { return routed_attention(r, v, plan, pad, 0.5, p, training); };
  auto local = [&](double p, bool training) { return local_attention(r, r, v, pad, 5, p, training); };
  for (const auto& op : {std::function<at::Tensor(double, bool)>(routed), std::function<at::Tensor(double, bool)>(local)}) {
    auto eval = op(0.3, false);
    EXPECT_TRUE(torch::equal(op(0.0, true), eval));
    torch::manual_seed(5);
    auto a = op(0.3, true);
    torch::manual_seed(5);
    auto b = op(0.3, true);
    EXPECT_TRUE(torch::equal(a, b));
    EXPECT_FALSE(torch::allclose(a, eval));
    EXPECT_EQ(a.masked_fill(pad.logical_not().view({B, 1, L, 1}), 0.0).abs().max().item<double>(), 0.0);
  }
}

TEST(RoutingAttention, BadArgumentsAreNamed) {
  const int64_t B = 2, H = 2, L = 6, D = 3, K = 2;
  auto r = torch::randn({B, H, L, D}), v = torch::randn({B, H, L, D + 1}), mu = torch::randn({H, K, D});
  auto pad = padding_mask({L, 4}, L, true);
  auto plan = causal_balanced_routing(r, mu, pad, 2, 2);

  EXPECT_THROW(causal_balanced_routing(r, mu, pad, 0, 2), c10::Error);
  EXPECT_THROW(local_attention(r, r, r, pad, 0, 0.0, false), c10::Error);
  expect_error([&] { causal_balanced_routing(r.select(1, 0), mu, pad, 2, 2); }, "r must be");
  expect_error([&] { causal_balanced_routing(r.to(torch::kLong), mu, pad, 2, 2); }, "r must be");
  expect_error([&] { causal_balanced_routing(r, torch::randn({H, K, D + 1}), pad, 2, 2); }, "centroids");
  expect_error([&] { causal_balanced_routing(r, torch::randn({H + 1, K, D}), pad, 2, 2); }, "centroids");
  expect_error([&] { causal_balanced_routing(r, mu.to(torch::kFloat64), pad, 2, 2); }, "centroids");
  expect_error([&] { causal_balanced_routing(r, mu, pad.to(torch::kLong), 2, 2); }, "key_padding");
  expect_error([&] { causal_balanced_routing(r, mu, pad.narrow(1, 0, L - 1), 2, 2); }, "key_padding");
  expect_error([&] { causal_balanced_routing(r, mu, pad, 0, 2); }, "window");
  expect_error([&] { causal_balanced_routing(r, mu, pad, 2, 0); }, "chunk");

  expect_error([&] { routed_attention(r, v.narrow(2, 0, L - 1), plan, pad, 1.0, 0.0, false); }, "v must be");
  expect_error([&] { routed_attention(r, v.to(torch::kFloat64), plan, pad, 1.0, 0.0, false); }, "v must be");
  expect_error([&] { routed_attention(r, v, plan, pad.to(torch::kFloat32), 1.0, 0.0, false); }, "key_padding");
  auto short_plan = causal_balanced_routing(r.narrow(2, 0, L - 1), mu, pad.narrow(1, 0, L - 1), 2, 2);
  expect_error([&] { routed_attention(r, v, short_plan, pad, 1.0, 0.0, false); }, "plan.window");
  expect_error([&] { routed_attention(r, v, RoutingPlan{plan.cluster, plan.window, plan.valid.to(torch::kLong)}, pad,
                                      1.0, 0.0, false); },
               "plan.valid");
  expect_error([&] { routed_attention(r, v, RoutingPlan{plan.cluster, plan.window + L, plan.valid}, pad, 1.0, 0.0,
                                      false); },
               "plan.window out of range");
  expect_error([&] { routed_attention(r, v, plan, pad, 1.0, 1.0, true); }, "dropout");

  expect_error([&] { local_attention(r.select(1, 0), r, r, pad, 2, 0.0, false); }, "q must be");
  expect_error([&] { local_attention(r, r.narrow(3, 0, 2), r, pad, 2, 0.0, false); }, "k must be");
  expect_error([&] { local_attention(r, r, r.to(torch::kFloat64), pad, 2, 0.0, false); }, "v must be");
  expect_error([&] { local_attention(r, r, r, pad.narrow(0, 0, 1), 2, 0.0, false); }, "key_padding");
  expect_error([&] { local_attention(r, r, r, pad, 0, 0.0, false); }, "window");
}

}  // namespace
