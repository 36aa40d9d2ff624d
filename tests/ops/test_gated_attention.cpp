// FLASH4Rec's gated attention (A·V with the softmax or the "1 + cos" form) against a loop-level
// reference in double, on shapes that break the 64-slot chunk tiling (length 1, odd lengths,
// lengths not a multiple of the chunk, all-padding rows, left and right padding, H > 1, s != e);
// the linear cosine path against the explicit matrix (a long sequence included); the fused
// kernel (CPU, and its CUDA body on an emulated warp) against the ATen reference; causality,
// padding isolation, gradients, Top-K attention dropout and named errors. Also the length
// slicing (ops/length_slices) that the length-grouped call and the trainer share.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/dropout/dropout.h"
#include "ops/gated_attention/gated_attention.h"
#include "ops/gated_attention/gated_attention_kernel.h"
#include "ops/length_slices/length_slices.h"
#include "tests/ops/op_test_util.h"

namespace {

using seqrec::ops::gated_attention;
using seqrec::ops::gated_attention_visibility;
using seqrec::ops::gated_attention_weights;
using seqrec::ops::GatedAttentionForm;
using seqrec::ops::GatedAttentionOptions;
using seqrec::ops::topk_positions;
using seqrec::testing::expect_error;
using seqrec::testing::max_err;
using seqrec::testing::padding_mask;

const auto kF64 = torch::kFloat64;
const GatedAttentionForm kForms[] = {GatedAttentionForm::kSoftmax, GatedAttentionForm::kCosine};

GatedAttentionOptions options(GatedAttentionForm form, bool causal, int64_t topk = 0, double p = 0.0,
                              bool training = false) {
  GatedAttentionOptions o;
  o.form = form;
  o.causal = causal;
  o.topk = topk;
  o.topk_dropout = p;
  o.training = training;
  return o;
}

std::string describe(GatedAttentionForm form, bool causal) {
  return std::string(seqrec::ops::gated_attention_form_name(form)) + (causal ? " causal" : " bidirectional");
}

struct Naive {
  at::Tensor weights, out;
};

// The header's definitions entry by entry: A[b, h, i, j] and out = A·v; padded queries give 0.
Naive naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
            GatedAttentionForm form, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = q.size(3), E = v.size(3);
  auto Q = q.accessor<double, 4>();
  auto K = k.accessor<double, 4>();
  auto V = v.accessor<double, 4>();
  auto P = pad.accessor<bool, 2>();
  Naive r{torch::zeros({B, H, L, L}, kF64), torch::zeros({B, H, L, E}, kF64)};
  auto W = r.weights.accessor<double, 4>();
  auto O = r.out.accessor<double, 4>();
  auto norm = [&](const at::TensorAccessor<double, 1>& x) {
    double n = 0;
    for (int64_t d = 0; d < S; ++d) n += x[d] * x[d];
    return std::max(std::sqrt(n), 1e-12);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        if (P[b][i]) continue;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < L; ++j)
          if (!P[b][j] && (!causal || j <= i)) keys.push_back(j);
        std::vector<double> a;
        double z = 0;
        if (form == GatedAttentionForm::kSoftmax) {
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j : keys) {
            double s = 0;
            for (int64_t d = 0; d < S; ++d) s += Q[b][h][i][d] * K[b][h][j][d];
            a.push_back(s / std::sqrt(static_cast<double>(S)));
            mx = std::max(mx, a.back());
          }
          for (auto& x : a) z += (x = std::exp(x - mx));
        } else {
          const double qn = norm(Q[b][h][i]);
          for (int64_t j : keys) {
            const double kn = norm(K[b][h][j]);
            double c = 0;
            for (int64_t d = 0; d < S; ++d) c += Q[b][h][i][d] / qn * (K[b][h][j][d] / kn);
            a.push_back(1.0 + c);
            z += a.back();
          }
          z = std::max(z, 1e-12);
        }
        for (size_t n = 0; n < keys.size(); ++n) {
          W[b][h][i][keys[n]] = a[n] / z;
          for (int64_t e = 0; e < E; ++e) O[b][h][i][e] += a[n] / z * V[b][h][keys[n]][e];
        }
      }
  return r;
}

struct Case {
  int64_t B, H, L, s, e;
  std::vector<int64_t> lengths;
  bool left;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {1, 1, 1, 3, 2, {1}, true},                 // L = 1
      {2, 1, 1, 2, 3, {0, 1}, false},             // L = 1, an all-padding row
      {2, 2, 13, 4, 3, {13, 7}, true},            // odd L, inside one chunk
      {1, 2, 64, 3, 7, {64}, true},               // exactly one chunk
      {2, 3, 67, 5, 4, {67, 30}, false},          // one slot past a chunk, right padding
      {3, 2, 130, 6, 5, {130, 0, 65}, true},      // three chunks, an all-padding row
      {2, 1, 129, 4, 4, {100, 129}, false},       // left/right variety past two chunks
      {3, 2, 77, 2, 9, {1, 76, 40}, true},        // one real slot, s << e
  };
  return all;
}

std::string where(const Case& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " L=" + std::to_string(c.L) +
         (c.left ? " left" : " right");
}

TEST(GatedAttention, MatchesLoopReference) {
  torch::manual_seed(31);
  for (const auto& c : cases()) {
    auto q = torch::randn({c.B, c.H, c.L, c.s}, kF64), k = torch::randn({c.B, c.H, c.L, c.s}, kF64);
    auto v = torch::randn({c.B, c.H, c.L, c.e}, kF64);
    auto pad = padding_mask(c.lengths, c.L, c.left);
    for (auto form : kForms)
      for (bool causal : {true, false}) {
        const auto o = options(form, causal);
        const std::string at = where(c) + " " + describe(form, causal);
        auto want = naive(q, k, v, pad, form, causal);
        auto out = gated_attention(q, k, v, pad, o);
        ASSERT_EQ(out.sizes(), v.sizes()) << at;
        EXPECT_LT(max_err(out, want.out), 1e-10) << at;
        auto weights = gated_attention_weights(q, k, pad, o);
        ASSERT_EQ(weights.sizes(), (std::vector<int64_t>{c.B, c.H, c.L, c.L})) << at;
        EXPECT_LT(max_err(weights, want.weights), 1e-10) << at;
        // Real rows are averages (sum 1), padded rows are 0.
        auto real = pad.logical_not().to(kF64).view({c.B, 1, c.L}).expand({c.B, c.H, c.L});
        EXPECT_LT(max_err(weights.sum(-1), real), 1e-12) << at;
      }
  }
}

TEST(GatedAttention, EmptySequences) {
  auto q = torch::randn({2, 3, 0, 4}, kF64), v = torch::randn({2, 3, 0, 5}, kF64);
  auto pad = torch::zeros({2, 0}, torch::kBool);
  for (auto form : kForms)
    for (bool causal : {true, false}) {
      EXPECT_EQ(gated_attention(q, q, v, pad, options(form, causal)).sizes(), v.sizes());
      EXPECT_EQ(gated_attention(q, q, v, pad, options(form, causal, 2, 0.5, true)).sizes(), v.sizes());
      EXPECT_EQ(gated_attention_weights(q, q, pad, options(form, causal)).sizes(),
                (std::vector<int64_t>{2, 3, 0, 0}));
    }
}

// The cosine form's linear path against the explicit matrix times v.
TEST(GatedAttention, CosineLinearPathEqualsExplicitMatrix) {
  torch::manual_seed(32);
  auto explicit_out = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
                         bool causal) {
    auto w = gated_attention_weights(q, k, pad, options(GatedAttentionForm::kCosine, causal));
    return torch::matmul(w, v).masked_fill(pad.view({q.size(0), 1, q.size(2), 1}), 0.0);
  };
  for (const auto& c : cases()) {
    auto q = torch::randn({c.B, c.H, c.L, c.s}, kF64), k = torch::randn({c.B, c.H, c.L, c.s}, kF64);
    auto v = torch::randn({c.B, c.H, c.L, c.e}, kF64);
    auto pad = padding_mask(c.lengths, c.L, c.left);
    for (bool causal : {true, false}) {
      auto out = gated_attention(q, k, v, pad, options(GatedAttentionForm::kCosine, causal));
      EXPECT_LT(max_err(out, explicit_out(q, k, v, pad, causal)), 1e-10) << where(c) << " causal=" << causal;
    }
  }
  // A long sequence against the explicit matrix (3000 x 3000, one head).
  {
    const int64_t L = 3000;
    auto q = torch::randn({1, 1, L, 8}, kF64), k = torch::randn({1, 1, L, 8}, kF64), v = torch::randn({1, 1, L, 8}, kF64);
    auto pad = padding_mask({L - 37}, L, true);
    for (bool causal : {true, false}) {
      auto out = gated_attention(q, k, v, pad, options(GatedAttentionForm::kCosine, causal));
      EXPECT_LT(max_err(out, explicit_out(q, k, v, pad, causal)), 1e-10) << "L=3000 causal=" << causal;
    }
  }
  // Longer still (a 20000 x 20000 matrix would take 3.2 GB): sampled rows against the
  // definition computed one row at a time.
  {
    const int64_t L = 20000, S = 4, E = 6;
    auto q = torch::randn({1, 1, L, S}, kF64), k = torch::randn({1, 1, L, S}, kF64), v = torch::randn({1, 1, L, E}, kF64);
    auto pad = padding_mask({L - 100}, L, false);
    auto qh = q[0][0] / q[0][0].norm(2, -1, true), kh = k[0][0] / k[0][0].norm(2, -1, true);
    auto real = pad[0].logical_not();
    for (bool causal : {true, false}) {
      auto out = gated_attention(q, k, v, pad, options(GatedAttentionForm::kCosine, causal));
      for (int64_t i : {0, 63, 64, 12345, 19899, 19900, 19999}) {
        auto visible = causal ? real & (torch::arange(L) <= i) : real.clone();
        auto raw = (1 + torch::matmul(kh, qh[i])).masked_fill(visible.logical_not(), 0.0);
        auto want = real[i].item<bool>() ? torch::matmul(raw / raw.sum(), v[0][0]) : torch::zeros({E}, kF64);
        EXPECT_LT(max_err(out[0][0][i], want), 1e-10) << "L=20000 causal=" << causal << " i=" << i;
      }
    }
  }
}

TEST(GatedAttention, FutureSlotsChangeNoEarlierOutputWhenCausal) {
  torch::manual_seed(33);
  const int64_t B = 2, H = 2, L = 150, S = 4, E = 5;
  for (bool left : {true, false}) {
    auto pad = padding_mask({L, 97}, L, left);
    auto q = torch::randn({B, H, L, S}, kF64), k = torch::randn({B, H, L, S}, kF64), v = torch::randn({B, H, L, E}, kF64);
    for (auto form : kForms) {
      auto out = gated_attention(q, k, v, pad, options(form, true));
      auto bi = gated_attention(q, k, v, pad, options(form, false));
      for (int64_t t : {1, 5, 63, 64, 65, 100, 128, 149}) {
        auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
        for (auto* x : {&q2, &k2, &v2}) x->select(2, t).normal_(0.0, 3.0);
        auto out2 = gated_attention(q2, k2, v2, pad, options(form, true));
        const std::string at = describe(form, true) + " left=" + std::to_string(left) + " t=" + std::to_string(t);
        EXPECT_LE(max_err(out2.narrow(2, 0, t), out.narrow(2, 0, t)), 1e-12) << at;
        // Slot t itself (real in row 0) does change: the check would pass vacuously otherwise.
        EXPECT_GT(max_err(out2[0].select(1, t), out[0].select(1, t)), 1e-6) << at;
        // Bidirectionally, the first real slot of row 0 sees slot t.
        auto bi2 = gated_attention(q2, k2, v2, pad, options(form, false));
        EXPECT_GT(max_err(bi2[0].select(1, 0), bi[0].select(1, 0)), 1e-6) << describe(form, false) << " t=" << t;
      }
    }
  }
}

TEST(GatedAttention, PaddedSlotsChangeNoRealOutput) {
  torch::manual_seed(34);
  const int64_t B = 3, H = 2, L = 71, S = 3, E = 4;
  for (bool left : {true, false}) {
    auto pad = padding_mask({L, 40, 0}, L, left);
    auto real = pad.logical_not().view({B, 1, L, 1});
    auto q = torch::randn({B, H, L, S}, kF64), k = torch::randn({B, H, L, S}, kF64), v = torch::randn({B, H, L, E}, kF64);
    auto scramble = [&](const at::Tensor& x) {
      return torch::where(pad.view({B, 1, L, 1}), 100.0 * torch::rand_like(x), x);
    };
    for (auto form : kForms)
      for (bool causal : {true, false})
        for (bool dropout : {false, true}) {
          const auto o = dropout ? options(form, causal, 3, 0.5, true) : options(form, causal);
          const std::string at = describe(form, causal) + " left=" + std::to_string(left) +
                                 " dropout=" + std::to_string(dropout);
          auto q2 = scramble(q), k2 = scramble(k), v2 = scramble(v);
          torch::manual_seed(7);
          auto out = gated_attention(q, k, v, pad, o);
          torch::manual_seed(7);
          auto out2 = gated_attention(q2, k2, v2, pad, o);
          EXPECT_LE(max_err(out.masked_select(real), out2.masked_select(real)), 1e-12) << at;
          EXPECT_EQ(out2.masked_fill(real, 0.0).abs().max().item<double>(), 0.0) << at;
        }
  }
}

// Autograd against central differences for both forms and both directions (the explicit path
// and the linear one, the latter across several chunks), with exactly zero gradient at padded
// slots' inputs; and through active Top-K dropout, whose mask a reseed holds fixed.
TEST(GatedAttention, GradientsMatchCentralDifferences) {
  torch::manual_seed(35);
  struct Shape {
    int64_t B, H, L, S, E, stride;
    std::vector<int64_t> lengths;
  };
  for (const auto& sh : {Shape{2, 2, 9, 3, 4, 3, {9, 5}}, Shape{1, 1, 70, 2, 3, 7, {66}}})
    for (bool left : {true, false}) {
      auto pad = padding_mask(sh.lengths, sh.L, left);
      auto at_pad = [&](const at::Tensor& g) {
        return g.masked_select(pad.view({sh.B, 1, sh.L, 1}).expand_as(g)).abs().max().item<double>();
      };
      auto q = torch::randn({sh.B, sh.H, sh.L, sh.S}, kF64).requires_grad_();
      auto k = torch::randn({sh.B, sh.H, sh.L, sh.S}, kF64).requires_grad_();
      auto v = torch::randn({sh.B, sh.H, sh.L, sh.E}, kF64).requires_grad_();
      auto g = torch::randn({sh.B, sh.H, sh.L, sh.E}, kF64);
      for (auto form : kForms)
        for (bool causal : {true, false})
          for (bool dropout : {false, true}) {
            const auto o = dropout ? options(form, causal, 2, 0.5, true) : options(form, causal);
            auto f = [&] {
              torch::manual_seed(11);
              return (gated_attention(q, k, v, pad, o) * g).sum();
            };
            SCOPED_TRACE(describe(form, causal) + " L=" + std::to_string(sh.L) + " left=" + std::to_string(left) +
                         " dropout=" + std::to_string(dropout));
            seqrec::testing::expect_gradients_match_central_differences(f, {q, k, v}, sh.stride);
            auto grads = torch::autograd::grad({f()}, {q, k, v});
            for (int n = 0; n < 3; ++n) EXPECT_EQ(at_pad(grads[n]), 0.0) << "input " << n;
            EXPECT_GT(grads[0].abs().max().item<double>(), 0.0);
          }
    }
}

TEST(GatedAttention, TopkDropoutIsIdentityWhenInactive) {
  torch::manual_seed(36);
  const int64_t B = 2, H = 2, L = 20, S = 4, E = 3;
  auto pad = padding_mask({L, 12}, L, true);
  auto q = torch::randn({B, H, L, S}, kF64), k = torch::randn({B, H, L, S}, kF64), v = torch::randn({B, H, L, E}, kF64);
  for (auto form : kForms)
    for (bool causal : {true, false}) {
      auto plain = gated_attention(q, k, v, pad, options(form, causal));
      const GatedAttentionOptions inactive[] = {options(form, causal, 3, 0.5, false),
                                                options(form, causal, 3, 0.0, true),
                                                options(form, causal, 0, 0.5, true)};
      for (const auto& o : inactive) {
        // No generator draw either: the stream after the call is the stream of a fresh seed.
        torch::manual_seed(5);
        auto out = gated_attention(q, k, v, pad, o);
        auto next = torch::rand({4}, kF64);
        torch::manual_seed(5);
        EXPECT_TRUE(torch::equal(next, torch::rand({4}, kF64))) << describe(form, causal);
        EXPECT_TRUE(torch::equal(out, plain)) << describe(form, causal);
      }
    }
}

TEST(GatedAttention, TopkDropoutDropsOnlyTopkEntriesAndKeepsMass) {
  torch::manual_seed(37);
  const int64_t B = 3, H = 2, L = 40, S = 4, E = 3, K = 3;
  const double p = 0.5;
  for (bool left : {true, false}) {
    auto pad = padding_mask({L, 25, 2}, L, left);
    auto q = torch::randn({B, H, L, S}, kF64), k = torch::randn({B, H, L, S}, kF64), v = torch::randn({B, H, L, E}, kF64);
    for (auto form : kForms)
      for (bool causal : {true, false}) {
        const std::string at = describe(form, causal) + " left=" + std::to_string(left);
        const auto o = options(form, causal, K, p, true);
        auto a = gated_attention_weights(q, k, pad, options(form, causal));
        auto visible = gated_attention_visibility(pad, causal);
        auto selected = topk_positions(a, visible, K);
        torch::manual_seed(8);
        auto dropped_a = gated_attention_weights(q, k, pad, o);
        // (a) Only Top-K entries are zeroed, and some are.
        auto dropped = (a > 0) & (dropped_a == 0);
        EXPECT_FALSE((dropped & selected.logical_not()).any().item<bool>()) << at;
        EXPECT_TRUE(dropped.any().item<bool>()) << at;
        // Everything else is scaled by one f per (b, h) (per row when causal):
        // f = sum(A) / sum(A ⊙ M).
        const std::vector<int64_t> dims = causal ? std::vector<int64_t>{-1} : std::vector<int64_t>{-2, -1};
        auto kept = a.masked_fill(dropped, 0.0);
        auto f = a.sum(dims, true) / kept.sum(dims, true).clamp_min(1e-300);  // padded rows: 0
        EXPECT_LT(max_err(dropped_a, kept * f), 1e-12) << at;
        // (b) The rescaled matrix keeps each (b, h)'s (each row's) total mass.
        EXPECT_LT(max_err(dropped_a.sum(dims), a.sum(dims)), 1e-12) << at;
        // The op's output is that matrix times v.
        torch::manual_seed(8);
        auto out = gated_attention(q, k, v, pad, o);
        EXPECT_LT(max_err(out, torch::matmul(dropped_a, v)), 1e-12) << at;
        // (c) Reproducible under one seed, different under another.
        torch::manual_seed(8);
        EXPECT_TRUE(torch::equal(gated_attention_weights(q, k, pad, o), dropped_a)) << at;
        torch::manual_seed(9);
        EXPECT_FALSE(torch::equal(gated_attention_weights(q, k, pad, o), dropped_a)) << at;
      }
  }
}

TEST(GatedAttention, TopkDropoutRateIsP) {
  torch::manual_seed(38);
  const int64_t B = 4, H = 4, L = 100, K = 5;
  auto pad = padding_mask({L, 60, 90, 100}, L, true);
  auto q = torch::randn({B, H, L, 6}, kF64), k = torch::randn({B, H, L, 6}, kF64);
  for (double p : {0.1, 0.5, 0.9}) {
    auto o = options(GatedAttentionForm::kSoftmax, true, K, p, true);
    auto a = gated_attention_weights(q, k, pad, options(GatedAttentionForm::kSoftmax, true));
    auto selected = topk_positions(a, gated_attention_visibility(pad, true), K);
    auto dropped = (gated_attention_weights(q, k, pad, o) == 0) & selected;
    const double rate = dropped.sum().item<double>() / selected.sum().item<double>();
    EXPECT_NEAR(rate, p, 0.03) << "p=" << p;  // ~6700 selected entries: 3 sigma < 0.02
  }
}

// (d) Selection: the k largest visible entries of each row, never an invisible or padded key,
// all visible entries of a row with fewer than k, nothing in padded queries' rows.
TEST(GatedAttention, TopkPositionsSelectOnlyVisibleEntries) {
  torch::manual_seed(39);
  const int64_t B = 3, H = 2, L = 23;
  for (bool left : {true, false})
    for (bool causal : {true, false})
      for (int64_t K : {1, 4, 30}) {
        auto pad = padding_mask({L, 9, 0}, L, left);
        auto q = torch::randn({B, H, L, 4}, kF64), k = torch::randn({B, H, L, 4}, kF64);
        for (auto form : kForms) {
          const std::string at = describe(form, causal) + " left=" + std::to_string(left) + " k=" + std::to_string(K);
          auto visible = gated_attention_visibility(pad, causal).expand({B, H, L, L});
          auto a = gated_attention_weights(q, k, pad, options(form, causal));
          auto s = topk_positions(a, visible, K);
          EXPECT_FALSE((s & visible.logical_not()).any().item<bool>()) << at;
          EXPECT_TRUE(torch::equal(s.sum(-1), visible.sum(-1).clamp_max(K))) << at;
          auto inf = std::numeric_limits<double>::infinity();
          auto lowest_selected = a.masked_fill(s.logical_not(), inf).amin(-1);
          auto highest_other = a.masked_fill(s | visible.logical_not(), -inf).amax(-1);
          EXPECT_FALSE((highest_other > lowest_selected).any().item<bool>()) << at;
        }
      }
  // A visible entry that is exactly 0 (a key antipodal to its query, 1 + cos = 0) is still
  // selected before the padded keys of the same weight 0 that precede it (left padding) or
  // follow it (right padding), whichever way topk breaks ties.
  for (bool left : {true, false}) {
    const int64_t L4 = 6, first = left ? 4 : 0;  // real slots first, first + 1
    auto q = torch::zeros({1, 1, L4, 2}, kF64), k = torch::full({1, 1, L4, 2}, 5.0, kF64);
    q[0][0][first + 1][0] = 1.0;
    k[0][0][first][0] = -1.0;
    k[0][0][first][1] = 0.0;
    k[0][0][first + 1][0] = 2.0;
    k[0][0][first + 1][1] = 0.0;
    auto pad = padding_mask({2}, L4, left);
    auto a = gated_attention_weights(q, k, pad, options(GatedAttentionForm::kCosine, false));
    ASSERT_EQ(a[0][0][first + 1][first].item<double>(), 0.0) << "left=" << left;
    auto s = topk_positions(a, gated_attention_visibility(pad, false), 2);
    auto want = torch::zeros({1, 1, L4, L4}, torch::kBool);
    want[0][0].narrow(0, first, 2).narrow(1, first, 2).fill_(true);
    EXPECT_TRUE(torch::equal(s, want)) << "left=" << left << "\n" << s;
  }
}

// The one scalar f per matrix couples rows: under causal=true with active Top-K dropout a later
// slot rescales earlier outputs, but only through f (their dropped positions stay the same).
// Causal attention rescales per row: a later slot changes no earlier row even in training, and
// every real row keeps its mass (a first slot that sees only itself is never emptied).
TEST(GatedAttention, CausalTopkDropoutKeepsCausality) {
  torch::manual_seed(40);
  const int64_t B = 1, H = 2, L = 30, t = 20;
  auto pad = padding_mask({L - 3}, L, true);
  auto q = torch::randn({B, H, L, 4}, kF64), k = torch::randn({B, H, L, 4}, kF64);
  auto q2 = q.clone(), k2 = k.clone();
  q2.select(2, t).normal_(0.0, 3.0);
  k2.select(2, t).normal_(0.0, 3.0);
  for (auto form : kForms) {
    const auto o = options(form, /*causal=*/true, 3, 0.5, true);
    torch::manual_seed(3);
    auto a = gated_attention_weights(q, k, pad, o);
    torch::manual_seed(3);
    auto a2 = gated_attention_weights(q2, k2, pad, o);
    EXPECT_EQ(max_err(a2.narrow(2, 0, t), a.narrow(2, 0, t)), 0.0) << describe(form, true);
    auto rows = a.sum(-1).narrow(2, 3, L - 3);
    EXPECT_LT(max_err(rows, torch::ones_like(rows)), 1e-12) << describe(form, true);
  }
}

TEST(GatedAttention, BadArgumentsAreNamed) {
  const int64_t B = 2, H = 2, L = 6, S = 3, E = 4;
  auto q = torch::randn({B, H, L, S}), v = torch::randn({B, H, L, E});
  auto pad = padding_mask({L, 4}, L, true);
  const auto ok = options(GatedAttentionForm::kCosine, true);
  auto with = [&](auto edit) {
    auto o = ok;
    edit(o);
    return o;
  };

  expect_error([&] { gated_attention(q.select(1, 0), q, v, pad, ok); }, "q must be");
  expect_error([&] { gated_attention(q.to(torch::kLong), q, v, pad, ok); }, "q must be");
  expect_error([&] { gated_attention(q, q.narrow(3, 0, 2), v, pad, ok); }, "k must be");
  expect_error([&] { gated_attention(q, q.to(torch::kFloat64), v, pad, ok); }, "k must be");
  expect_error([&] { gated_attention(q, q, v.narrow(2, 0, L - 1), pad, ok); }, "v must be");
  expect_error([&] { gated_attention(q, q, v.to(torch::kFloat64), pad, ok); }, "v must be");
  expect_error([&] { gated_attention(q, q, v, pad.to(torch::kLong), ok); }, "key_padding");
  expect_error([&] { gated_attention(q, q, v, pad.narrow(1, 0, L - 1), ok); }, "key_padding");
  expect_error([&] { gated_attention(q, q, v, pad, with([](auto& o) { o.form = static_cast<GatedAttentionForm>(7); })); },
               "form");
  expect_error([&] { gated_attention(q, q, v, pad, with([](auto& o) { o.topk = -1; })); }, "topk");
  expect_error([&] { gated_attention(q, q, v, pad, with([](auto& o) { o.topk_dropout = 1.0; })); }, "topk_dropout");
  expect_error([&] { gated_attention(q, q, v, pad, with([](auto& o) { o.topk_dropout = -0.1; })); }, "topk_dropout");
  // Checked in eval too, where dropout would be skipped.
  expect_error([&] { gated_attention_weights(q, q, pad, with([](auto& o) { o.topk_dropout = 2.0; })); },
               "topk_dropout");
  expect_error([&] { gated_attention_weights(q, q.narrow(2, 0, 2), pad, ok); }, "k must be");
  expect_error([&] { gated_attention_visibility(pad.to(torch::kFloat32), true); }, "key_padding");
  auto w = gated_attention_weights(q, q, pad, ok);
  auto visible = gated_attention_visibility(pad, true);
  expect_error([&] { topk_positions(w, visible, 0); }, "topk");
  expect_error([&] { topk_positions(w.select(1, 0), visible, 2); }, "weights");
  expect_error([&] { topk_positions(w, visible.to(torch::kFloat32), 2); }, "visible");

  EXPECT_EQ(seqrec::ops::parse_gated_attention_form("softmax"), GatedAttentionForm::kSoftmax);
  EXPECT_EQ(seqrec::ops::parse_gated_attention_form("cosine"), GatedAttentionForm::kCosine);
  for (auto form : kForms)
    EXPECT_EQ(seqrec::ops::parse_gated_attention_form(seqrec::ops::gated_attention_form_name(form)), form);
  EXPECT_THROW(seqrec::ops::parse_gated_attention_form("relu2"), std::invalid_argument);
}

// The length-grouped call equals the whole-batch call on left-padded rows (every form, causal and
// bidirectional, groups that split ties, an all-padding row, groups > rows), outputs and the
// gradients of q, k and v; right-padded rows run whole (still equal); under active Top-K dropout
// it stays finite and zero at padded slots.
TEST(GatedAttention, LengthGroupsGiveTheWholeBatchResult) {
  torch::manual_seed(41);
  const int64_t B = 7, H = 2, L = 23, S = 5, E = 6;
  const std::vector<int64_t> lengths = {23, 4, 17, 0, 17, 1, 9};
  for (bool left : {true, false})
    for (auto form : kForms)
      for (bool causal : {true, false})
        for (int64_t groups : {2, 3, 8}) {
          auto pad = padding_mask(lengths, L, left);
          auto q0 = torch::randn({B, H, L, S}, kF64), k0 = torch::randn({B, H, L, S}, kF64),
               v0 = torch::randn({B, H, L, E}, kF64), g = torch::randn({B, H, L, E}, kF64);
          std::vector<at::Tensor> out, grads[2];
          for (int path = 0; path < 2; ++path) {
            auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
            auto o = path == 0 ? gated_attention(q, k, v, pad, options(form, causal))
                               : seqrec::ops::gated_attention_by_length(q, k, v, pad, options(form, causal), groups);
            out.push_back(o.detach());
            grads[path] = torch::autograd::grad({(o * g).sum()}, {q, k, v});
          }
          const std::string at = describe(form, causal) + " left=" + std::to_string(left) +
                                  " groups=" + std::to_string(groups);
          EXPECT_TRUE(torch::allclose(out[1], out[0], 1e-12, 1e-12)) << at << " max err " << max_err(out[1], out[0]);
          for (int i = 0; i < 3; ++i)
            EXPECT_TRUE(torch::allclose(grads[1][i], grads[0][i], 1e-11, 1e-12))
                << at << " grad " << i << " max err " << max_err(grads[1][i], grads[0][i]);
        }
  auto pad = padding_mask(lengths, L, true);
  auto q = torch::randn({B, 1, L, S}), k = torch::randn({B, 1, L, S}), v = torch::randn({B, 1, L, E});
  auto o = seqrec::ops::gated_attention_by_length(q, k, v, pad, options(GatedAttentionForm::kSoftmax, true, 3, 0.5, true), 3);
  EXPECT_TRUE(torch::isfinite(o).all().item<bool>());
  EXPECT_EQ(o.masked_select(pad.view({B, 1, L, 1}).expand_as(o)).abs().max().item<double>(), 0.0);
  expect_error([&] { seqrec::ops::gated_attention_by_length(q, k, v, pad.narrow(1, 0, L - 1), options(GatedAttentionForm::kSoftmax, true), 2); },
               "key_padding");
}

// Slicing by length: rows longest first with ties in batch order, runs of ceil(B / groups),
// each as wide as its first row, slices of empty rows dropped, and the inverse order.
// The configurations the fused kernel takes: the softmax form either way, and both forms under
// causal Top-K dropout (topk below and above the row lengths, so that some rows lose every entry
// and are kept whole).
struct FusedConfig {
  GatedAttentionForm form;
  bool causal;
  int64_t topk;
  double p;
};

const std::vector<FusedConfig>& fused_configs() {
  static const std::vector<FusedConfig> all = {
      {GatedAttentionForm::kSoftmax, true, 0, 0.0},  {GatedAttentionForm::kSoftmax, false, 0, 0.0},
      {GatedAttentionForm::kSoftmax, true, 3, 0.5},  {GatedAttentionForm::kCosine, true, 3, 0.5},
      {GatedAttentionForm::kSoftmax, true, 200, 0.3}, {GatedAttentionForm::kCosine, true, 1, 0.9},
  };
  return all;
}

std::string describe(const FusedConfig& f, at::ScalarType dtype) {
  return describe(f.form, f.causal) + " topk " + std::to_string(f.topk) + " p " + std::to_string(f.p) +
         (dtype == torch::kFloat64 ? " double" : " float");
}

struct Grads {
  at::Tensor out, gq, gk, gv;
};

// The reference's output and gradients for upstream gradient g, its Top-K dropout seeded by
// manual_seed(seed).
Grads reference_grads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
                      const GatedAttentionOptions& o, const at::Tensor& g, uint64_t seed) {
  auto qr = q.detach().requires_grad_(), kr = k.detach().requires_grad_(), vr = v.detach().requires_grad_();
  torch::manual_seed(seed);
  auto out = seqrec::ops::gated_attention_reference(qr, kr, vr, pad, o);
  auto grads = torch::autograd::grad({out}, {qr, kr, vr}, {g});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// Float: the kernel's dot products run four partial sums, the reference's GEMMs their own order;
// over s, e <= 9 and L <= 130 both are within a few ulp of the largest value.
void expect_close(const Grads& got, const Grads& want, double tol, const std::string& where) {
  auto close = [&](const at::Tensor& a, const at::Tensor& b) {
    return torch::isfinite(a).all().item<bool>() && max_err(a, b) <= tol * std::max(1.0, b.abs().max().item<double>());
  };
  EXPECT_TRUE(close(got.out, want.out)) << where << " out, max err " << max_err(got.out, want.out);
  EXPECT_TRUE(close(got.gq, want.gq)) << where << " grad q, max err " << max_err(got.gq, want.gq);
  EXPECT_TRUE(close(got.gk, want.gk)) << where << " grad k, max err " << max_err(got.gk, want.gk);
  EXPECT_TRUE(close(got.gv, want.gv)) << where << " grad v, max err " << max_err(got.gv, want.gv);
}

// One configuration's random inputs on one shape case, and where they came from.
struct FusedInputs {
  const Case& c;
  const FusedConfig& f;
  at::ScalarType dtype;
  GatedAttentionOptions o;
  at::Tensor q, k, v, g, pad;
  std::string at;
};

// f(inputs) for every case of `all`, float and double, and every configuration the kernel takes.
template <class F>
void for_each_fused_input(const std::vector<Case>& all, F&& f) {
  for (const auto& c : all)
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (const auto& cfg : fused_configs()) {
        std::vector<int64_t> lengths = c.lengths;
        lengths.resize(c.B, c.L);
        const FusedInputs in{c,
                             cfg,
                             dtype,
                             options(cfg.form, cfg.causal, cfg.topk, cfg.p, true),
                             torch::randn({c.B, c.H, c.L, c.s}, dtype),
                             torch::randn({c.B, c.H, c.L, c.s}, dtype),
                             torch::randn({c.B, c.H, c.L, c.e}, dtype),
                             torch::randn({c.B, c.H, c.L, c.e}, dtype),
                             padding_mask(lengths, c.L, c.left),
                             where(c) + " " + describe(cfg, dtype)};
        f(in);
      }
}

// The fused kernel's host glue and rows on the CPU (a one-lane warp; what gated_attention runs on
// a CUDA device, with a 32-lane warp) against the reference under one generator state: values
// and the three gradients, every shape case, float and double, each configuration it takes.
TEST(GatedAttention, FusedKernelMatchesReference) {
  torch::manual_seed(41);
  for_each_fused_input(cases(), [](const FusedInputs& in) {
    ASSERT_TRUE(seqrec::ops::gated_attention_kernel_supports(in.q, in.v, in.o)) << in.at;
    EXPECT_FALSE(seqrec::ops::gated_attention_fused_takes(in.q, in.v, in.o)) << in.at << ": the CPU runs the reference";
    auto qf = in.q.clone().requires_grad_(), kf = in.k.clone().requires_grad_(), vf = in.v.clone().requires_grad_();
    torch::manual_seed(7);
    auto out = seqrec::ops::gated_attention_fused(qf, kf, vf, in.pad, in.o);
    ASSERT_TRUE(out.grad_fn()) << in.at;
    EXPECT_NE(out.grad_fn()->name().find("FusedGatedAttention"), std::string::npos) << in.at;
    auto grads = torch::autograd::grad({out}, {qf, kf, vf}, {in.g});
    expect_close({out.detach(), grads[0], grads[1], grads[2]}, reference_grads(in.q, in.k, in.v, in.pad, in.o, in.g, 7),
                 in.dtype == torch::kFloat64 ? 1e-10 : 2e-5, in.at);
  });
}

// The fused kernel's cases and the ones it leaves to the reference.
TEST(GatedAttention, FusedKernelSupportsTheExplicitPathsCases) {
  auto q = torch::randn({1, 1, 5, 4}), v = torch::randn({1, 1, 5, 3});
  using seqrec::ops::gated_attention_kernel_supports;
  EXPECT_TRUE(gated_attention_kernel_supports(q, v, options(GatedAttentionForm::kSoftmax, true)));
  EXPECT_TRUE(gated_attention_kernel_supports(q, v, options(GatedAttentionForm::kSoftmax, false)));
  EXPECT_TRUE(gated_attention_kernel_supports(q, v, options(GatedAttentionForm::kCosine, true, 2, 0.1, true)));
  // The cosine form's linear path; bidirectional Top-K dropout's one rescale per matrix.
  EXPECT_FALSE(gated_attention_kernel_supports(q, v, options(GatedAttentionForm::kCosine, true)));
  EXPECT_FALSE(gated_attention_kernel_supports(q, v, options(GatedAttentionForm::kCosine, true, 2, 0.1, false)));
  EXPECT_FALSE(gated_attention_kernel_supports(q, v, options(GatedAttentionForm::kSoftmax, false, 2, 0.1, true)));
  EXPECT_FALSE(gated_attention_kernel_supports(q.to(torch::kBFloat16), v, options(GatedAttentionForm::kSoftmax, true)));
  EXPECT_FALSE(
      gated_attention_kernel_supports(torch::randn({1, 1, 5, 257}), v, options(GatedAttentionForm::kSoftmax, true)));
  // On the CPU gated_attention runs the reference.
  auto out = gated_attention(q.requires_grad_(), q, v, torch::zeros({1, 5}, torch::kBool),
                             options(GatedAttentionForm::kSoftmax, true));
  EXPECT_EQ(out.grad_fn()->name().find("FusedGatedAttention"), std::string::npos) << out.grad_fn()->name();
}

// The CUDA kernels' body (gated_attention.cu runs these row functions with one warp per row) on
// an emulated 32-lane warp, against the reference: values and gradients, as above.
template <typename T>
Grads emulated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
               const GatedAttentionOptions& o, const at::Tensor& g, uint64_t seed) {
  namespace gk = seqrec::ops::cuda::gated_kernel;
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), rows = B * H * L;
  const bool dropout = o.training && o.topk > 0 && o.topk_dropout > 0;
  Grads r{torch::zeros_like(v), torch::zeros_like(q), torch::zeros_like(k), torch::zeros_like(v)};
  auto qn = q.norm(2, -1).contiguous(), kn = k.norm(2, -1).contiguous();
  auto stats = torch::zeros({rows, gk::kStats}, q.options());
  auto dropped = torch::full({rows, std::max<int64_t>(o.topk, 1)}, -7, torch::kInt);
  auto gc = g.contiguous(), padc = pad.contiguous();
  gk::Args<T> a{};
  a.q = q.data_ptr<T>();
  a.k = k.data_ptr<T>();
  a.v = v.data_ptr<T>();
  a.pad = padc.data_ptr<bool>();
  const bool cosine = o.form == GatedAttentionForm::kCosine;
  a.qn = cosine ? qn.data_ptr<T>() : nullptr;
  a.kn = cosine ? kn.data_ptr<T>() : nullptr;
  a.out = r.out.data_ptr<T>();
  a.stats = stats.data_ptr<T>();
  a.dropped = dropout ? dropped.data_ptr<int32_t>() : nullptr;
  a.grad = gc.data_ptr<T>();
  a.gq = r.gq.data_ptr<T>();
  a.gk = r.gk.data_ptr<T>();
  a.gv = r.gv.data_ptr<T>();
  a.B = B;
  a.H = H;
  a.L = L;
  a.s = q.size(3);
  a.e = v.size(3);
  a.topk = o.topk;
  a.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  a.causal = o.causal;
  a.cosine = cosine;
  if (dropout) {
    torch::manual_seed(seed);
    a.hash_base = seqrec::ops::mix64(seqrec::ops::random_seed() ^ 0x9E3779B97F4A7C15ull);
    a.threshold = static_cast<uint32_t>(o.topk_dropout * 65536.0 + 0.5);
  }
  gk::emulate(a, /*backward=*/false);
  gk::emulate(a, /*backward=*/true);
  return r;
}

TEST(GatedAttention, CudaKernelLogicMatchesReference) {
  torch::manual_seed(43);
  auto all = cases();
  all.push_back({2, 1, 45, 40, 70, {45, 20}, true});  // rows wider than a warp (s 40, e 70)
  for_each_fused_input(all, [](const FusedInputs& in) {
    auto got = in.dtype == torch::kFloat64 ? emulated<double>(in.q, in.k, in.v, in.pad, in.o, in.g, 9)
                                           : emulated<float>(in.q, in.k, in.v, in.pad, in.o, in.g, 9);
    expect_close(got, reference_grads(in.q, in.k, in.v, in.pad, in.o, in.g, 9),
                 in.dtype == torch::kFloat64 ? 1e-10 : 2e-5, in.at);
  });
}

// The CUDA kernels (what gated_attention runs on a CUDA device) against the reference on the CPU
// under one generator state: values and gradients, float and double, the shape cases and
// FLASH4Rec's (L 200, s 128, e 128) with its Top-K dropout. GPU machines only.
TEST(GatedAttention, CudaKernelMatchesReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  torch::manual_seed(44);
  auto all = cases();
  all.push_back({16, 1, 200, 128, 128, {200, 120, 7, 1}, true});
  for_each_fused_input(all, [](const FusedInputs& in) {
    // In float, 3,200 rows of 200 keys hold near-ties at the topk-th entry that the two
    // devices' roundings may order differently (a different entry dropped): double there.
    if (in.dtype == torch::kFloat32 && in.f.topk > 0 && in.c.L == 200) return;
    const torch::Device cuda(torch::kCUDA);
    auto qd = in.q.to(cuda).requires_grad_(), kd = in.k.to(cuda).requires_grad_(), vd = in.v.to(cuda).requires_grad_();
    ASSERT_TRUE(seqrec::ops::gated_attention_fused_takes(qd, vd, in.o)) << in.at;
    torch::manual_seed(7);
    auto out = gated_attention(qd, kd, vd, in.pad.to(cuda), in.o);
    EXPECT_NE(out.grad_fn()->name().find("FusedGatedAttention"), std::string::npos) << in.at;
    auto grads = torch::autograd::grad({out}, {qd, kd, vd}, {in.g.to(cuda)});
    expect_close({out.detach().cpu(), grads[0].cpu(), grads[1].cpu(), grads[2].cpu()},
                 reference_grads(in.q, in.k, in.v, in.pad, in.o, in.g, 7), in.dtype == torch::kFloat64 ? 1e-10 : 1e-4,
                 in.at);
  });
}

// Top-K dropout's CPU pass against its ATen composition under one generator state: A' and the
// gradient w.r.t. A, one rescale per row and per matrix, topk below and above the row lengths
// (rows that lose every entry are kept whole), both forms' weights, float and double.
TEST(GatedAttention, TopkDropoutCpuPassMatchesReference) {
  torch::manual_seed(45);
  for (const auto& c : cases())
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (auto form : kForms)
        for (bool causal : {true, false})
          for (int64_t topk : {1, 3, 200})
            for (double p : {0.3, 0.9}) {
              auto q = torch::randn({c.B, c.H, c.L, c.s}, dtype), k = torch::randn({c.B, c.H, c.L, c.s}, dtype);
              auto pad = padding_mask(c.lengths, c.L, c.left);
              auto a = gated_attention_weights(q, k, pad, options(form, causal)).detach();
              auto visible = gated_attention_visibility(pad, causal);
              auto g = torch::randn(a.sizes(), dtype);
              const std::string at = where(c) + " " + describe(form, causal) + " topk " + std::to_string(topk) +
                                     " p " + std::to_string(p) + (dtype == torch::kFloat64 ? " double" : " float");
              auto run = [&](bool reference) {
                auto w = a.clone().requires_grad_();
                torch::manual_seed(5);
                auto out = reference
                               ? seqrec::ops::topk_attention_dropout_reference(w, visible, topk, p, true, causal)
                               : seqrec::ops::topk_attention_dropout(w, visible, topk, p, true, causal);
                auto gw = torch::autograd::grad({out}, {w}, {g})[0];
                return std::make_pair(out.detach(), gw);
              };
              auto got = run(false), want = run(true);
              EXPECT_NE(got.first.data_ptr(), a.data_ptr()) << at;
              const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
              EXPECT_LE(max_err(got.first, want.first), tol * std::max(1.0, want.first.abs().max().item<double>())) << at;
              EXPECT_LE(max_err(got.second, want.second), tol * std::max(1.0, want.second.abs().max().item<double>()))
                  << at;
            }
}

TEST(LengthSlices, SortedRunsAsWideAsTheirLongestRow) {
  using seqrec::ops::slice_by_length;
  auto lengths = torch::tensor(std::vector<int64_t>{3, 0, 7, 3, 0, 5, 0});
  auto rows_of = [](const seqrec::ops::LengthSlice& s) {
    return std::vector<int64_t>(s.rows.data_ptr<int64_t>(), s.rows.data_ptr<int64_t>() + s.rows.numel());
  };
  auto cut = slice_by_length(lengths, 3);  // runs of 3: {2, 5, 0}, {3, 1, 4}, {6}
  ASSERT_EQ(cut.slices.size(), 2u);
  EXPECT_EQ(rows_of(cut.slices[0]), (std::vector<int64_t>{2, 5, 0}));
  EXPECT_EQ(cut.slices[0].width, 7);
  EXPECT_EQ(rows_of(cut.slices[1]), (std::vector<int64_t>{3, 1, 4}));
  EXPECT_EQ(cut.slices[1].width, 3);
  EXPECT_EQ(cut.covered, 6);
  EXPECT_EQ(cut.shortest, 0);
  for (int64_t groups : {-1, 0, 1}) {
    auto one = slice_by_length(lengths, groups);
    ASSERT_EQ(one.slices.size(), 1u) << groups;
    EXPECT_EQ(one.slices[0].width, 7);
    EXPECT_EQ(one.covered, 7);
  }
  auto each = slice_by_length(lengths, 100);  // one row per slice, the empty ones in none
  ASSERT_EQ(each.slices.size(), 4u);
  EXPECT_EQ(each.covered, 4);
  EXPECT_EQ(slice_by_length(torch::zeros({0}, torch::kLong), 4).slices.size(), 0u);
  EXPECT_EQ(slice_by_length(torch::zeros({3}, torch::kLong), 2).covered, 0);
  // take_slice keeps the last `width` columns of the slice's rows.
  auto t = torch::arange(7 * 8).view({7, 8});
  auto part = seqrec::ops::take_slice(t, cut.slices[1], 1);
  EXPECT_TRUE(torch::equal(part, t.index_select(0, torch::tensor(std::vector<int64_t>{3, 1, 4})).narrow(1, 5, 3)));
  auto back = t.index_select(0, cut.order).index_select(0, seqrec::ops::inverse_order(cut.order));
  EXPECT_TRUE(torch::equal(back, t));
  expect_error([&] { slice_by_length(lengths.to(torch::kInt), 2); }, "lengths");
}

}  // namespace
