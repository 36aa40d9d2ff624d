// LISA's codeword-histogram attention against a loop-level reference in double: shapes that
// break the 64-slot chunking (length 1, odd lengths, several chunks, two scan levels),
// C and W of 1, left and right padding, all-padding rows, decay 1 and e^-0.1, soft and one-hot
// weights; causality, padding isolation, gradients against a differentiable double reference
// and central differences, long-sequence stability, and named errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ops/lisa_attention/lisa_attention.h"
#include "ops/lisa_attention/lisa_attention_kernel.h"
#include "tests/ops/op_test_util.h"

namespace {
using seqrec::testing::expect_error;
using seqrec::testing::max_err;

using seqrec::ops::decayed_prefix_sum;
using seqrec::ops::lisa_attention;

const double kDecay = std::exp(-0.1);

at::Tensor padding(const std::vector<int64_t>& lengths, int64_t L, bool left = true) {
  return seqrec::testing::padding_mask(lengths, L, left);
}

struct Inputs {
  at::Tensor weights, index, pad, table, values;
};

// Soft rows are softmaxes (index = their argmax); one-hot rows are one_hot(index). Padded slots
// hold garbage weights on purpose: the op must zero them itself.
Inputs make_inputs(int64_t B, int64_t L, int64_t C, int64_t W, int64_t D, const at::Tensor& pad, bool onehot,
                   torch::Dtype dtype = torch::kFloat32) {
  Inputs in;
  if (onehot) {
    in.index = torch::randint(0, W, {B, L, C}, torch::kLong);
    in.weights = torch::one_hot(in.index, W).to(dtype);
  } else {
    in.weights = torch::softmax(2.0 * torch::randn({B, L, C, W}, dtype), -1);
    in.index = in.weights.argmax(-1);
  }
  in.weights.masked_fill_(pad.view({B, L, 1, 1}), 3.0);
  in.pad = pad;
  in.table = 1.5 * torch::randn({C, W, W}, dtype);
  in.values = torch::randn({C, W, D}, dtype);
  return in;
}

using LisaFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, double);
// The two paths: what the models call (the fused CPU kernel here) and the ATen reference.
const std::vector<std::pair<const char*, LisaFn>> kPaths = {{"fused", &lisa_attention},
                                                            {"reference", &seqrec::ops::lisa_attention_reference}};

at::Tensor run(const Inputs& in, double decay, LisaFn fn = &lisa_attention) {
  return fn(in.weights, in.index, in.pad, in.table, in.values, decay);
}

// F[b, i, n] = sum_{j <= i} decay^(i-j) x[b, j, n], in double, by the definition.
at::Tensor naive_scan(const at::Tensor& x, double decay) {
  const int64_t B = x.size(0), L = x.size(1);
  auto xd = x.to(torch::kFloat64).reshape({B, L, -1}).contiguous();
  const int64_t N = xd.size(2);
  std::vector<double> pw(L);
  for (int64_t k = 0; k < L; ++k) pw[k] = std::pow(decay, static_cast<double>(k));
  auto X = xd.accessor<double, 3>();
  auto out = torch::zeros({B, L, N}, torch::kFloat64);
  auto O = out.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t n = 0; n < N; ++n) O[b][i][n] += pw[i - j] * X[b][j][n];
  return out.view(x.sizes());
}

// The op by its definition, in double: padded slots add nothing and output 0; a codebook whose
// histogram row is all zero adds nothing.
at::Tensor naive(const Inputs& in, double decay) {
  const int64_t B = in.weights.size(0), L = in.weights.size(1), C = in.weights.size(2),
                W = in.weights.size(3), D = in.values.size(2);
  auto wd = in.weights.to(torch::kFloat64).contiguous(), td = in.table.to(torch::kFloat64).contiguous(),
       vd = in.values.to(torch::kFloat64).contiguous();
  auto E = wd.accessor<double, 4>();
  auto T = td.accessor<double, 3>();
  auto V = vd.accessor<double, 3>();
  auto I = in.index.accessor<int64_t, 3>();
  auto P = in.pad.accessor<bool, 2>();
  auto out = torch::zeros({B, L, D}, torch::kFloat64);
  auto O = out.accessor<double, 3>();
  std::vector<double> pw(L), F(W);
  for (int64_t k = 0; k < L; ++k) pw[k] = std::pow(decay, static_cast<double>(k));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i) {
      if (P[b][i]) continue;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t w = 0; w < W; ++w) {
          F[w] = 0;
          for (int64_t j = 0; j <= i; ++j)
            if (!P[b][j]) F[w] += pw[i - j] * E[b][j][c][w];
        }
        const int64_t u = I[b][i][c];
        double z = 0;
        for (int64_t w = 0; w < W; ++w) z += F[w] * std::exp(T[c][u][w]);
        if (z == 0) continue;
        for (int64_t w = 0; w < W; ++w)
          for (int64_t d = 0; d < D; ++d) O[b][i][d] += F[w] * std::exp(T[c][u][w]) / z * V[c][w][d];
      }
    }
  return out;
}

// The same definition in differentiable double tensor ops (O(L²) decay matrix, per-slot
// gathers), for gradients.
at::Tensor naive_autograd(const at::Tensor& weights, const at::Tensor& index, const at::Tensor& pad,
                          const at::Tensor& table, const at::Tensor& values, double decay) {
  const int64_t B = weights.size(0), L = weights.size(1), C = weights.size(2), W = weights.size(3);
  auto real = pad.logical_not().to(torch::kFloat64).view({B, L, 1, 1});
  auto m = torch::zeros({L, L}, torch::kFloat64);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j <= i; ++j) m[i][j] = std::pow(decay, static_cast<double>(i - j));
  auto F = torch::einsum("ij,bjn->bin", {m, (weights * real).reshape({B, L, C * W})}).reshape({B, L, C, W});
  auto I = index.accessor<int64_t, 3>();
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < C; ++c) rows.push_back(table[c][I[b][i][c]]);
  auto T = torch::stack(rows).view({B, L, C, W});
  auto e = F * torch::exp(T);
  auto z = e.sum(-1, true);
  auto ok = (z.detach() > 0).logical_and(real.to(torch::kBool));
  auto A = torch::where(ok, e / torch::where(ok, z, torch::ones_like(z)), torch::zeros_like(e));
  return torch::einsum("bicw,cwd->bid", {A, values});
}

struct Case {
  int64_t B, L, C, W, D;
  std::vector<int64_t> lengths;
  bool left;
};

TEST(LisaAttention, MatchesLoopReference) {
  torch::manual_seed(11);
  std::vector<Case> cases = {{1, 1, 1, 1, 1, {1}, true},          {2, 7, 3, 5, 3, {7, 3}, true},
                             {3, 67, 1, 5, 5, {67, 40, 0}, true},  {2, 130, 3, 5, 7, {130, 1}, true},
                             {2, 64, 2, 1, 3, {64, 17}, true},      {2, 65, 3, 4, 9, {65, 30}, false},
                             {1, 7, 1, 1, 1, {0}, true}};
  for (const auto& [path, fn] : kPaths)
  for (const auto& c : cases)
    for (double decay : {1.0, kDecay})
      for (bool onehot : {false, true}) {
        SCOPED_TRACE(path);
        auto in = make_inputs(c.B, c.L, c.C, c.W, c.D, padding(c.lengths, c.L, c.left), onehot);
        auto got = run(in, decay, fn);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{c.B, c.L, c.D}));
        ASSERT_TRUE(torch::isfinite(got).all().item<bool>());
        auto want = naive(in, decay);
        // fp32 against a float64 loop: histograms up to 130, logits within ~±6, outputs O(1).
        EXPECT_TRUE(torch::allclose(got.to(torch::kFloat64), want, 1e-5, 1e-5))
            << "L=" << c.L << " C=" << c.C << " W=" << c.W << " decay=" << decay << " onehot=" << onehot
            << " max err " << max_err(got, want);
        // The same op in double isolates the algorithm from fp32 rounding.
        Inputs ind = in;
        for (auto* t : {&ind.weights, &ind.table, &ind.values}) *t = t->to(torch::kFloat64);
        EXPECT_TRUE(torch::allclose(run(ind, decay, fn), want, 1e-11, 1e-12))
            << "double, L=" << c.L << " max err " << max_err(run(ind, decay, fn), want);
      }
}

TEST(LisaAttention, PrefixSumMatchesLoopReference) {
  torch::manual_seed(12);
  // 4150 > 64·64 slots: the chunk states are themselves scanned in chunks (two levels).
  for (int64_t L : {1, 7, 63, 64, 65, 130, 4150})
    for (double decay : {1.0, kDecay, 0.5}) {
      auto x = torch::rand({2, L, 2, 3}, torch::kFloat64);
      auto want = naive_scan(x, decay);
      auto got = decayed_prefix_sum(x, decay);
      EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-10)) << "L=" << L << " decay=" << decay << " "
                                                              << max_err(got, want);
      auto got32 = decayed_prefix_sum(x.to(torch::kFloat32), decay);
      EXPECT_TRUE(torch::allclose(got32.to(torch::kFloat64), want, 1e-5, 1e-5))
          << "fp32 L=" << L << " decay=" << decay << " " << max_err(got32, want);
    }
}

TEST(LisaAttention, PrefixSumOfCountsIsExactForDecayOne) {
  torch::manual_seed(13);
  // Integer histograms are exact in fp32: any decay factor other than exactly 1 would show.
  auto x = torch::one_hot(torch::randint(0, 5, {3, 300, 2}, torch::kLong), 5).to(torch::kFloat32);
  EXPECT_TRUE(torch::equal(decayed_prefix_sum(x, 1.0), torch::cumsum(x, 1)));
}

TEST(LisaAttention, FutureItemsDoNotChangeEarlierOutputs) {
  torch::manual_seed(14);
  const int64_t L = 130;
  auto in = make_inputs(2, L, 3, 5, 4, padding({L, 90}, L), true);
  for (double decay : {1.0, kDecay}) {
    auto base = run(in, decay);
    for (int64_t t : {41, 63, 64, 100, 129}) {
      Inputs moved = in;
      moved.weights = in.weights.clone();
      moved.index = in.index.clone();
      moved.weights.select(1, t).uniform_(0, 2);
      moved.index.select(1, t).random_(0, 5);
      auto out = run(moved, decay);
      EXPECT_TRUE(torch::equal(out.narrow(1, 0, t), base.narrow(1, 0, t))) << "changing slot " << t;
      EXPECT_FALSE(torch::allclose(out.narrow(1, t, L - t), base.narrow(1, t, L - t))) << "slot " << t;
    }
  }
}

TEST(LisaAttention, PaddedSlotsDoNotChangeRealOutputs) {
  torch::manual_seed(15);
  const int64_t L = 75;
  for (bool left : {true, false}) {
    auto pad = padding({75, 50, 3}, L, left);
    for (bool onehot : {false, true}) {
      auto in = make_inputs(3, L, 2, 4, 5, pad, onehot);
      auto base = run(in, kDecay);
      Inputs moved = in;
      moved.weights = in.weights.clone();
      moved.index = in.index.clone();
      auto p = pad.view({3, L, 1, 1});
      moved.weights = torch::where(p, torch::rand_like(in.weights) * 100, in.weights);
      moved.index = torch::where(pad.view({3, L, 1}), torch::randint_like(in.index, 0, 4), in.index);
      auto out = run(moved, kDecay);
      auto real = pad.logical_not().view({3, L, 1});
      EXPECT_TRUE(torch::equal(out.masked_fill(real.logical_not(), 0), base.masked_fill(real.logical_not(), 0)))
          << "left=" << left << " onehot=" << onehot;
      // Padded slots output exactly 0 on either padding side.
      EXPECT_EQ(out.masked_fill(real, 0).abs().max().item<double>(), 0.0);
    }
  }
}

TEST(LisaAttention, GradientsMatchDifferentiableReference) {
  torch::manual_seed(16);
  const int64_t B = 3, L = 70, C = 3, W = 4, D = 5;
  auto pad = padding({70, 20, 0}, L);
  for (const auto& [path, fn] : kPaths)
  for (double decay : {1.0, kDecay})
    for (bool onehot : {false, true}) {
      SCOPED_TRACE(path);
      auto in = make_inputs(B, L, C, W, D, pad, onehot, torch::kFloat64);
      auto g = torch::randn({B, L, D}, torch::kFloat64);
      auto w = in.weights.clone().requires_grad_(), t = in.table.clone().requires_grad_(),
           v = in.values.clone().requires_grad_();
      auto got = torch::autograd::grad({(fn(w, in.index, pad, t, v, decay) * g).sum()}, {w, t, v});
      auto want = torch::autograd::grad({(naive_autograd(w, in.index, pad, t, v, decay) * g).sum()}, {w, t, v});
      const char* names[] = {"weights", "table", "values"};
      for (int k = 0; k < 3; ++k) {
        ASSERT_TRUE(torch::isfinite(got[k]).all().item<bool>()) << names[k];
        EXPECT_TRUE(torch::allclose(got[k], want[k], 1e-6, 1e-9))
            << names[k] << " decay=" << decay << " onehot=" << onehot << " max err "
            << max_err(got[k], want[k]);
      }
      // One-hot rows still pass gradient to their zero entries (straight-through estimators rely
      // on it), and padded slots get none.
      auto gw = got[0];
      if (onehot) {
        auto at_zeros = torch::logical_and(in.weights == 0, pad.logical_not().view({B, L, 1, 1}));
        EXPECT_GT(gw.masked_select(at_zeros).abs().max().item<double>(), 0.0);
      }
      EXPECT_EQ(gw.masked_select(pad.view({B, L, 1, 1}).expand_as(gw)).abs().max().item<double>(), 0.0);
    }
}

TEST(LisaAttention, GradientsMatchCentralDifferences) {
  torch::manual_seed(17);
  const int64_t B = 2, L = 9, C = 2, W = 3, D = 3;
  auto pad = padding({9, 4}, L);
  auto in = make_inputs(B, L, C, W, D, pad, true, torch::kFloat64);
  in.weights.masked_fill_(pad.view({B, L, 1, 1}), 0.0);
  auto g = torch::randn({B, L, D}, torch::kFloat64);
  auto w = in.weights.clone().requires_grad_(), t = in.table.clone().requires_grad_(),
       v = in.values.clone().requires_grad_();
  auto f = [&] { return (lisa_attention(w, in.index, pad, t, v, kDecay) * g).sum(); };
  seqrec::testing::expect_gradients_match_central_differences(f, {w, t, v});
}

TEST(LisaAttention, LongSequencesStayFinite) {
  torch::manual_seed(18);
  const int64_t L = 2048, C = 2, W = 4, D = 8;
  // Row 1 is right-padded after 10 items: its histogram decays through ~e^-200 towards 0 over
  // the padded tail, the regime where an unguarded normaliser produces 0·inf.
  auto pad = torch::stack({padding({L}, L)[0], padding({10}, L, false)[0]});
  auto in = make_inputs(2, L, C, W, D, pad, false);
  auto x = in.weights.masked_fill(pad.view({2, L, 1, 1}), 0.0);
  auto hist = decayed_prefix_sum(x, kDecay);
  ASSERT_TRUE(torch::isfinite(hist).all().item<bool>());
  EXPECT_TRUE(torch::allclose(hist.to(torch::kFloat64), naive_scan(x, kDecay), 1e-4, 1e-5));
  auto w = in.weights.clone().requires_grad_(), t = in.table.clone().requires_grad_(),
       v = in.values.clone().requires_grad_();
  auto out = lisa_attention(w, in.index, pad, t, v, kDecay);
  ASSERT_TRUE(torch::isfinite(out).all().item<bool>());
  auto want = naive(in, kDecay);
  EXPECT_TRUE(torch::allclose(out.detach().to(torch::kFloat64), want, 1e-4, 1e-4))
      << max_err(out.detach(), want);
  (out * torch::randn_like(out)).sum().backward();
  for (auto* p : {&w, &t, &v}) EXPECT_TRUE(torch::isfinite(p->grad()).all().item<bool>());
}

TEST(LisaAttention, BadInputIsNamed) {
  const int64_t B = 2, L = 5, C = 3, W = 4, D = 2;
  auto in = make_inputs(B, L, C, W, D, padding({5, 2}, L), false);
  auto call = [&](const at::Tensor& w, const at::Tensor& idx, const at::Tensor& pad, const at::Tensor& t,
                  const at::Tensor& v, double decay) {
    return [=] { lisa_attention(w, idx, pad, t, v, decay); };
  };
  expect_error(call(in.weights, in.index, in.pad, in.table, in.values, 0.0), "decay");
  expect_error(call(in.weights, in.index, in.pad, in.table, in.values, 1.5), "decay");
  expect_error(call(in.weights, in.index, in.pad, in.table, in.values, std::nan("")), "decay");
  expect_error([&] { decayed_prefix_sum(in.weights, 0.0); }, "decay");
  expect_error([&] { decayed_prefix_sum(in.weights, -0.5); }, "decay");
  auto high = in.index.clone();
  high[1][3][2] = W;
  expect_error(call(in.weights, high, in.pad, in.table, in.values, 1.0), "query_index out of range");
  auto low = in.index.clone();
  low[0][0][0] = -1;
  expect_error(call(in.weights, low, in.pad, in.table, in.values, 1.0), "query_index out of range");
  expect_error(call(in.weights, in.index.narrow(1, 0, 4), in.pad, in.table, in.values, 1.0), "query_index");
  expect_error(call(in.weights, in.index, in.pad.narrow(1, 0, 4), in.table, in.values, 1.0), "key_padding");
  expect_error(call(in.weights, in.index, in.pad.to(torch::kLong), in.table, in.values, 1.0), "key_padding");
  expect_error(call(in.weights, in.index, in.pad, torch::randn({C, W, W + 1}), in.values, 1.0), "table");
  expect_error(call(in.weights, in.index, in.pad, torch::randn({C + 1, W, W}), in.values, 1.0), "table");
  expect_error(call(in.weights, in.index, in.pad, in.table, torch::randn({C, W - 1, D}), 1.0), "values");
  expect_error(call(in.weights, in.index, in.pad, in.table, in.values.to(torch::kFloat64), 1.0), "values");
  expect_error(call(in.weights.select(3, 0), in.index, in.pad, in.table, in.values, 1.0), "weights");
}

// The fused CPU kernel against the ATen reference in fp32 at a model-like shape (several
// (sequence, codebook) tasks per thread, W wider than a vector register, both paddings, both
// decays, soft and one-hot rows): outputs and all three gradients.
TEST(LisaAttention, FusedMatchesReferenceInFloat) {
  torch::manual_seed(19);
  const int64_t B = 6, L = 97, C = 4, W = 37, D = 11;
  for (bool left : {true, false})
    for (double decay : {1.0, kDecay})
      for (bool onehot : {false, true}) {
        auto pad = padding({97, 60, 1, 0, 33, 96}, L, left);
        auto in = make_inputs(B, L, C, W, D, pad, onehot);
        auto g = torch::randn({B, L, D});
        std::vector<at::Tensor> outs, grads[2];
        for (int k = 0; k < 2; ++k) {
          auto w = in.weights.clone().requires_grad_(), t = in.table.clone().requires_grad_(),
               v = in.values.clone().requires_grad_();
          auto out = kPaths[k].second(w, in.index, pad, t, v, decay);
          outs.push_back(out.detach());
          grads[k] = torch::autograd::grad({(out * g).sum()}, {w, t, v});
        }
        const std::string where = std::string("left=") + (left ? "1" : "0") + " decay=" + std::to_string(decay) +
                                  " onehot=" + (onehot ? "1" : "0");
        EXPECT_TRUE(torch::allclose(outs[0], outs[1], 1e-5, 1e-6)) << where << " max err " << max_err(outs[0], outs[1]);
        const char* names[] = {"weights", "table", "values"};
        for (int k = 0; k < 3; ++k) {
          ASSERT_TRUE(torch::isfinite(grads[0][k]).all().item<bool>()) << names[k] << " " << where;
          const double scale = grads[1][k].abs().max().item<double>();
          EXPECT_LE(max_err(grads[0][k], grads[1][k]), 1e-5 * std::max(1.0, scale))
              << names[k] << " " << where << " max err " << max_err(grads[0][k], grads[1][k]) << " of " << scale;
        }
      }
}

// Codewords whose logits and decayed counts disagree by 80 nats: the one-log shift bound leaves
// the normaliser near fp32's smallest normal number, where the other codeword's term is off by
// e^7 (exp's clamp), so the kernel must fall back to the exact shift.
TEST(LisaAttention, FusedHandlesLogitsAndCountsFarApart) {
  const int64_t L = 801, W = 2, D = 3;
  Inputs in;
  in.index = torch::zeros({1, L, 1}, torch::kLong);
  in.index[0][L - 1][0] = 1;
  in.weights = torch::one_hot(in.index, W).to(torch::kFloat32);  // codeword 0 at 0..L-2, 1 at L-1
  in.weights.narrow(1, 1, L - 2).zero_();                          // codeword 0 once, at slot 0
  in.pad = torch::zeros({1, L}, torch::kBool);
  in.table = torch::zeros({1, W, W});
  in.table[0][1][0] = 200.0;  // slot L-1 asks with codeword 1: T = [200, 0]
  in.values = torch::randn({1, W, D});
  const double decay = std::exp(-0.1);  // codeword 0's count is e^-80 by slot L-1
  auto got = run(in, decay);
  auto want = naive(in, decay);
  ASSERT_TRUE(torch::isfinite(got).all().item<bool>());
  EXPECT_TRUE(torch::allclose(got.to(torch::kFloat64), want, 1e-4, 1e-5)) << max_err(got, want);
  auto w = in.weights.clone().requires_grad_(), t = in.table.clone().requires_grad_();
  auto out = lisa_attention(w, in.index, in.pad, t, in.values, decay);
  (out * torch::randn_like(out)).sum().backward();
  EXPECT_TRUE(torch::isfinite(w.grad()).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(t.grad()).all().item<bool>());
}

// A shape for the CUDA kernels' checks, and the words a failure names it by.
struct KernelCase {
  int64_t B, L, C, W, D;
};

std::string describe(const KernelCase& k, torch::Dtype dtype, bool left, double decay, bool onehot) {
  return std::string(dtype == torch::kFloat64 ? "double" : "float") + " B " + std::to_string(k.B) + " L " +
         std::to_string(k.L) + " C " + std::to_string(k.C) + " W " + std::to_string(k.W) + " left " +
         std::to_string(left) + " decay " + std::to_string(decay) + " onehot " + std::to_string(onehot);
}

// Rows of full, no and half length in turn.
at::Tensor mixed_padding(const KernelCase& k, bool left) {
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < k.B; ++b) lengths.push_back(b % 3 == 0 ? k.L : (b % 3 == 1 ? 0 : k.L / 2));
  return padding(lengths, k.L, left);
}

// Finite, and within tol of want relative to want's largest magnitude (at least 1).
bool close_to(const at::Tensor& got, const at::Tensor& want, double tol) {
  return torch::isfinite(got).all().item<bool>() &&
         max_err(got.cpu(), want) <= tol * std::max(1.0, want.abs().max().item<double>());
}

// The CUDA kernels' row functions (lisa_attention_kernel.h) on the CPU with an emulated warp:
// out, and the gradients of weights, table and values for the output gradient gout, composed as
// the CUDA op composes them (the products by the values as GEMMs). A, r and g start as NaN, so a
// slot the kernels leave unwritten shows.
template <typename T>
std::vector<at::Tensor> emulated_cuda_op(const Inputs& in, double decay, const at::Tensor& gout, int64_t seg_len = 0) {
  namespace lk = seqrec::ops::cuda::lisa_kernel;
  auto weights = in.weights.contiguous(), table = in.table.contiguous(), values = in.values.contiguous();
  auto index = in.index.contiguous(), pad = in.pad.contiguous();
  const int64_t B = weights.size(0), L = weights.size(1), C = weights.size(2), W = weights.size(3),
                D = values.size(2);
  auto A = torch::full({B, L, C, W}, std::nan(""), weights.options());
  auto r = torch::full({B, L, C}, std::nan(""), weights.options());
  lk::Args<T> a{weights.data_ptr<T>(), index.data_ptr<int64_t>(), pad.data_ptr<bool>(), table.data_ptr<T>(),
                A.data_ptr<T>(), r.data_ptr<T>(), nullptr, nullptr, B, L, C, W, static_cast<T>(decay)};
  // Each launch pair gets its own workspace, as on the device; NaN where nothing was written.
  a.seg_len = seg_len;
  const int64_t scratch = lk::workspace_elements(B * C, L, W, seg_len);
  auto sums = torch::full({std::max<int64_t>(scratch, 1)}, std::nan(""), weights.options());
  a.sums = scratch > 0 ? sums.data_ptr<T>() : nullptr;
  lk::emulate(a, /*backward=*/false);
  EXPECT_FALSE(torch::isnan(A).any().item<bool>() || torch::isnan(r).any().item<bool>()) << "a slot left unwritten";
  auto out = A.view({B * L, C * W}).mm(values.view({C * W, D})).view({B, L, D});
  auto g2 = gout.contiguous().view({B * L, D});
  auto gvalues = A.view({B * L, C * W}).t().mm(g2).view({C, W, D});
  auto g = g2.mm(values.view({C * W, D}).t()).view({B, L, C, W}).contiguous();
  auto gtable = torch::zeros({C, W, W}, weights.options());
  a.g = g.data_ptr<T>();
  a.gtable = gtable.data_ptr<T>();
  sums.fill_(std::nan(""));
  lk::emulate(a, /*backward=*/true);
  return {out, g, gtable, gvalues};
}

// Against the CPU's fused kernel, in double and float: W below, at and past a lane's 32
// codewords up to the 512 the kernel takes (every codewords-per-lane instantiation), left and
// right padding with empty and full rows, decay 1 and e^-0.1, soft and one-hot weights, one
// segment and segments of 7 and 16 slots (a short last one; padding across their bounds), and
// logits and counts 200 nats apart (the exact-shift fallback). What this cannot show (the
// device's shuffles, atomics, launch errors) is CudaKernelMatchesCpuKernel's, on a GPU.
TEST(LisaAttention, CudaKernelLogicMatchesCpuKernel) {
  torch::manual_seed(21);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (KernelCase k : std::vector<KernelCase>{{1, 1, 1, 1, 2},
                                                {3, 37, 2, 5, 4},
                                                {3, 70, 3, 32, 7},
                                                {2, 45, 2, 33, 5},
                                                {2, 30, 2, 100, 3},
                                                {2, 25, 1, 256, 4},
                                                {1, 12, 2, 300, 3},
                                                {1, 9, 1, 512, 2}})
      for (bool left : {true, false})
        for (double decay : {1.0, kDecay})
          for (bool onehot : {false, true})
            for (int64_t seg_len : {int64_t{0}, int64_t{7}, int64_t{16}}) {
              if (k.W >= 256 && (!left || onehot)) continue;  // the widest rows in fewer settings
              if (seg_len > 0 && (k.L <= seg_len || (k.W > 64 && seg_len == 7))) continue;
              auto pad = mixed_padding(k, left);
              auto in = make_inputs(k.B, k.L, k.C, k.W, k.D, pad, onehot, dtype);
              auto gout = torch::randn({k.B, k.L, k.D}, dtype);
              auto w = in.weights.clone().requires_grad_(), t = in.table.clone().requires_grad_(),
                   v = in.values.clone().requires_grad_();
              auto want = lisa_attention(w, in.index, pad, t, v, decay);  // the CPU's fused kernel
              auto g_want = torch::autograd::grad({want}, {w, t, v}, {gout});
              auto got = dtype == torch::kFloat64 ? emulated_cuda_op<double>(in, decay, gout, seg_len)
                                                  : emulated_cuda_op<float>(in, decay, gout, seg_len);
              const std::string where = describe(k, dtype, left, decay, onehot) + " seg_len " + std::to_string(seg_len);
              // Float: the kernel sums over codewords by lanes and butterfly, in exact exp, where the
              // CPU kernel sums in order with a polynomial exp (relative error below 2e-7): both are
              // within about 1e-6 of the largest magnitude, and 1e-5 leaves room over 300 slots.
              const double tol = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
              EXPECT_TRUE(close_to(got[0], want.detach(), tol)) << where << " out, max err " << max_err(got[0], want);
              const char* names[] = {"weights", "table", "values"};
              for (int n = 0; n < 3; ++n)
                EXPECT_TRUE(close_to(got[n + 1], g_want[n], tol))
                    << where << " " << names[n] << " gradient, max err " << max_err(got[n + 1], g_want[n]);
            }

  // Logits and counts far apart (as FusedHandlesLogitsAndCountsFarApart): the exact shift.
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const int64_t L = 801, W = 2, D = 3;
    Inputs in;
    in.index = torch::zeros({1, L, 1}, torch::kLong);
    in.index[0][L - 1][0] = 1;
    in.weights = torch::one_hot(in.index, W).to(dtype);
    in.weights.narrow(1, 1, L - 2).zero_();
    in.pad = torch::zeros({1, L}, torch::kBool);
    in.table = torch::zeros({1, W, W}, dtype);
    in.table[0][1][0] = 200.0;
    in.values = torch::randn({1, W, D}, dtype);
    auto want = naive(in, kDecay);
    for (int64_t seg_len : {0, 100}) {  // the histogram reaches the last slot across 8 segments too
      auto gout = torch::ones({1, L, D}, dtype);
      auto got = dtype == torch::kFloat64 ? emulated_cuda_op<double>(in, kDecay, gout, seg_len)
                                          : emulated_cuda_op<float>(in, kDecay, gout, seg_len);
      EXPECT_TRUE(torch::allclose(got[0].to(torch::kFloat64), want, 1e-4, 1e-5))
          << "seg_len " << seg_len << ": " << max_err(got[0], want);
      for (const auto& t : got) EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << "seg_len " << seg_len;
    }
  }
  // Where the one-log bound underflows every term even with an exact exp: codeword 0 seen once
  // with weight 1e-44 and logit 200, codeword 1 a hundred times with logit 0, so the bound sits
  // 106 nats above codeword 0's term (fp32 stops at 103). Only the exact shift keeps the last
  // slot's output (values[0]) from vanishing.
  {
    const int64_t L = 101, W = 2, D = 3;
    Inputs in;
    in.weights = torch::zeros({1, L, 1, W});
    in.weights[0][0][0][0] = 1e-44f;
    in.weights.narrow(1, 1, L - 1).select(3, 1).fill_(1.0f);
    in.index = torch::zeros({1, L, 1}, torch::kLong);
    in.index[0][L - 1][0] = 1;
    in.pad = torch::zeros({1, L}, torch::kBool);
    in.table = torch::zeros({1, W, W});
    in.table[0][1][0] = 200.0f;
    in.values = torch::randn({1, W, D});
    auto got = emulated_cuda_op<float>(in, 1.0, torch::ones({1, L, D}));
    auto want = lisa_attention(in.weights, in.index, in.pad, in.table, in.values, 1.0);
    EXPECT_TRUE(torch::allclose(got[0][0][L - 1], in.values[0][0], 1e-5, 1e-6)) << got[0][0][L - 1];
    EXPECT_TRUE(torch::allclose(got[0], want, 1e-5, 1e-6)) << max_err(got[0], want);
  }
}

// Where the launcher cuts rows into segments: only grids short of kWarpsPerSm warps per
// multiprocessor and rows of at least 2 x kMinSegment slots, into about enough segments to fill
// the device, each at least kMinSegment slots, at most kMaxSegments per row.
TEST(LisaAttention, CudaSegmentPlan) {
  namespace lk = seqrec::ops::cuda::lisa_kernel;
  using seqrec::ops::cuda::segments;
  EXPECT_EQ(lk::plan_segment_len(16 * 132, 300, 132), 300);  // a grid that fills the device
  EXPECT_EQ(lk::plan_segment_len(128 * 8, 100, 132), 100);  // under 2 x kMinSegment
  EXPECT_EQ(lk::plan_segment_len(128 * 8, 300, 132), 100);  // LISA-Base's paper setting on an H200: 3 segments
  EXPECT_EQ(lk::workspace_elements(48, 100, 128, 100), 0);
  EXPECT_EQ(segments(100, 0), 1);
  for (auto [rows, L, sms] : std::vector<std::array<int64_t, 3>>{
           {48, 4096, 132}, {200, 1024, 132}, {1024, 200, 132}, {1, 1000, 132}, {1, 128, 1}, {8, 1 << 20, 132}}) {
    const int64_t len = lk::plan_segment_len(rows, L, sms), segs = segments(L, len);
    const std::string where = "rows " + std::to_string(rows) + " L " + std::to_string(L);
    EXPECT_GE(len, lk::kMinSegment) << where;
    EXPECT_GT(segs, 1) << where;
    EXPECT_LE(segs, lk::kMaxSegments) << where;
    const int64_t target = lk::kWarpsPerSm * sms;
    if ((target + rows - 1) / rows <= std::min<int64_t>(lk::kMaxSegments, L / lk::kMinSegment)) {
      EXPECT_GE(rows * segs, target) << where;
      EXPECT_LT(rows * (segs - 1), target) << where;  // no more segments than it takes
    }
    EXPECT_EQ(lk::workspace_elements(rows, L, 128, len), rows * segs * 128) << where;
    // Segments tile the row: each begins where the one before ended, the last ends at L.
    int64_t begin = 0, end = 0, at = 0;
    for (int64_t g = 0; g < segs; ++g) {
      seqrec::ops::cuda::segment_bounds(L, len, g, begin, end);
      EXPECT_EQ(begin, at) << where;
      EXPECT_GT(end, begin) << where;
      at = end;
    }
    EXPECT_EQ(at, L) << where;
  }
  EXPECT_EQ(lk::plan_segment_len(48, 4096, 132), 94);  // 44 segments: 2,112 warps
}

// The launch's grid: kRowWarps (row, segment) warps per block, and a batch whose warps need more
// than the grid's 2^31 - 1 blocks refused by name before any launch (too large to build a test
// tensor for, so the count comes from the kernel's own arithmetic on the shape alone).
TEST(LisaAttention, CudaGridPastItsLimitIsRefusedByName) {
  namespace lk = seqrec::ops::cuda::lisa_kernel;
  using seqrec::ops::cuda::kRowWarps;
  using seqrec::ops::cuda::row_blocks;
  lk::Args<float> a{};
  a.B = 128;
  a.L = 300;
  a.C = 8;
  a.seg_len = 100;  // 3 segments
  EXPECT_EQ(lk::launch_warps(a, false), 128 * 8 * 3);
  EXPECT_EQ(lk::launch_warps(a, true), 128 * 8 * 2);
  EXPECT_EQ(row_blocks(lk::launch_warps(a, false), "LISA attention", "(row, segment) warps"),
            static_cast<unsigned>(128 * 8 * 3 / kRowWarps));
  EXPECT_EQ(row_blocks(5, "LISA attention", "warps"), 2u);  // a partial block rounds up
  a.B = int64_t{1} << 30;  // 2^30 rows x 8 codebooks x 3 segments: 6 x 2^31 blocks
  try {
    row_blocks(lk::launch_warps(a, false), "LISA attention", "(row, segment) warps");
    ADD_FAILURE() << "a grid past 2^31 - 1 blocks was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("LISA attention (CUDA): 25769803776 (row, segment) warps is beyond the kernel's grid"),
              std::string::npos)
        << e.what();
  }
  const int64_t most = int64_t{0x7fffffff} * kRowWarps;  // exactly the grid's limit
  EXPECT_EQ(row_blocks(most, "op", "rows"), 0x7fffffffu);
  EXPECT_THROW(row_blocks(most + 1, "op", "rows"), std::invalid_argument);
}

// The CUDA kernels (what lisa_attention runs on a CUDA device) against the CPU's fused kernel on
// the same inputs: values and the three gradients, float and double, W from 1 to 512 and one
// past it (600, left to the reference), padding, decay, soft and one-hot weights, and many rows
// sharing the table's gradient (atomic adds), short grids the launcher cuts into segments (8
// rows of 300 and 1,000 slots: 4 and 15 segments; 512 rows of 200: 3); then causality on the
// device. GPU machines only.
TEST(LisaAttention, CudaKernelMatchesCpuKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  torch::manual_seed(22);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (KernelCase k : std::vector<KernelCase>{{1, 1, 1, 1, 2},
                                                {3, 37, 2, 5, 4},
                                                {64, 200, 8, 128, 16},
                                                {2, 45, 2, 33, 5},
                                                {4, 300, 2, 100, 8},
                                                {2, 25, 1, 256, 4},
                                                {1, 12, 2, 512, 3},
                                                {1, 10, 1, 600, 3},
                                                {2, 1000, 4, 128, 8}})
      for (double decay : {1.0, kDecay})
        for (bool onehot : {false, true}) {
          auto pad = mixed_padding(k, true);
          auto in = make_inputs(k.B, k.L, k.C, k.W, k.D, pad, onehot, dtype);
          auto gout = torch::randn({k.B, k.L, k.D}, dtype);
          auto run_on = [&](const torch::Device& device) {
            auto w = in.weights.to(device).requires_grad_(), t = in.table.to(device).requires_grad_(),
                 v = in.values.to(device).requires_grad_();
            auto out = lisa_attention(w, in.index.to(device), pad.to(device), t, v, decay);
            auto grads = torch::autograd::grad({out}, {w, t, v}, {gout.to(device)});
            return std::make_pair(out, grads);
          };
          auto [want, g_want] = run_on(torch::kCPU);
          auto [got, g_got] = run_on(torch::kCUDA);
          const std::string where = describe(k, dtype, true, decay, onehot);
          ASSERT_TRUE(got.is_cuda()) << where;
          const bool kernel = got.grad_fn()->name().find("LisaAttentionFused") != std::string::npos;
          EXPECT_EQ(kernel, k.W <= 512) << where << ": " << got.grad_fn()->name();
          // As in the emulation, plus the device's atomic adds into the table's gradient, whose
          // order varies from run to run.
          const double tol = dtype == torch::kFloat64 ? 1e-10 : 2e-5;
          EXPECT_TRUE(close_to(got, want, tol)) << where << " out";
          const char* names[] = {"weights", "table", "values"};
          for (int n = 0; n < 3; ++n) EXPECT_TRUE(close_to(g_got[n], g_want[n], tol)) << where << " " << names[n];
        }

  // Causality on the device, in 3 segments of 67 slots: changing slots >= 100 leaves slots < 100
  // bit for bit.
  auto pad = torch::zeros({4, 200}, torch::kBool);
  auto in = make_inputs(4, 200, 3, 40, 6, pad, false);
  auto before = lisa_attention(in.weights.cuda(), in.index.cuda(), pad.cuda(), in.table.cuda(), in.values.cuda(), kDecay);
  auto w2 = in.weights.clone();
  w2.narrow(1, 100, 100).uniform_();
  auto after = lisa_attention(w2.cuda(), in.index.cuda(), pad.cuda(), in.table.cuda(), in.values.cuda(), kDecay);
  EXPECT_TRUE(torch::equal(before.narrow(1, 0, 100), after.narrow(1, 0, 100)));
  EXPECT_FALSE(torch::equal(before.narrow(1, 100, 100), after.narrow(1, 100, 100)));
}

// The models reach the fused kernel on the CPU (its autograd node), and the reference elsewhere
// by the same call; equal results at any thread count.
TEST(LisaAttention, CpuCallsRunTheFusedKernel) {
  torch::manual_seed(20);
  auto in = make_inputs(3, 20, 2, 8, 4, padding({20, 5, 0}, 20), false);
  auto w = in.weights.clone().requires_grad_();
  auto out = lisa_attention(w, in.index, in.pad, in.table, in.values, kDecay);
  ASSERT_TRUE(out.grad_fn());
  EXPECT_NE(out.grad_fn()->name().find("LisaAttentionFused"), std::string::npos) << out.grad_fn()->name();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto one = run(in, kDecay);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, out.detach()));
}

}  // namespace
