// LinRec's linear attention against a loop-level reference in double: both normalisations
// (paper, code) and both forms (causal, global), shapes that break the chunking (length 1,
// odd lengths, several chunks), left padding and all-padding rows; causality, padding
// isolation, and gradients against central differences. The causal product's fused CPU kernel
// against its chunked ATen reference, and (on a GPU machine) its CUDA kernel against the CPU's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "ops/exp_nonpositive.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/linear_attention/linear_attention_cuda.h"
#include "tests/ops/op_test_util.h"

namespace {

using seqrec::testing::padding_mask;

using namespace seqrec::ops;

double elu(double x) { return x >= 0 ? x : std::expm1(x); }

// out[b, h, t] for real slots t; padded slots are left at zero (the op leaves them unspecified).
at::Tensor naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pad,
                 LinrecNorm norm, LinrecForm form) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  auto qa = q.to(torch::kFloat64).contiguous(), ka = k.to(torch::kFloat64).contiguous(),
       va = v.to(torch::kFloat64).contiguous();
  auto Q = qa.accessor<double, 4>(), K = ka.accessor<double, 4>(), V = va.accessor<double, 4>();
  auto P = pad.accessor<bool, 2>();
  auto out = torch::zeros({B, H, L, D}, torch::kFloat64);
  auto O = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < L; ++t) {
        if (P[b][t]) continue;
        std::vector<int64_t> S;
        for (int64_t s = 0; s < L; ++s)
          if (!P[b][s] && (form == LinrecForm::kGlobal || s <= t)) S.push_back(s);
        std::vector<double> qn(D);
        double qnorm = 0;
        for (int64_t d = 0; d < D; ++d) qnorm += elu(Q[b][h][t][d]) * elu(Q[b][h][t][d]);
        qnorm = std::sqrt(qnorm);
        for (int64_t d = 0; d < D; ++d)
          qn[d] = elu(Q[b][h][t][d]) / (norm == LinrecNorm::kPaper ? std::sqrt(double(D)) * qnorm : qnorm);
        std::vector<double> col(D, 0.0);
        for (int64_t s : S)
          for (int64_t d = 0; d < D; ++d) col[d] += elu(K[b][h][s][d]) * elu(K[b][h][s][d]);
        for (int64_t s : S) {
          double knorm = 0;
          for (int64_t d = 0; d < D; ++d) knorm += elu(K[b][h][s][d]) * elu(K[b][h][s][d]);
          knorm = std::sqrt(knorm);
          double score = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double kd = norm == LinrecNorm::kPaper
                                  ? elu(K[b][h][s][d]) / (std::sqrt(double(S.size())) * std::sqrt(col[d]))
                                  : elu(K[b][h][s][d]) / knorm;
            score += qn[d] * kd;
          }
          if (norm == LinrecNorm::kCode) score /= std::sqrt(double(D));
          for (int64_t d = 0; d < D; ++d) O[b][h][t][d] += score * V[b][h][s][d];
        }
      }
  return out;
}

at::Tensor real_only(const at::Tensor& out, const at::Tensor& pad) {
  return out.masked_fill(pad.unsqueeze(1).unsqueeze(-1), 0.0);
}

// A product's shape: q, k [B, H, L, Dk], v [B, H, L, Dv].
struct Shape {
  int64_t B, H, L, Dk, Dv;
};

std::string describe(const Shape& c, torch::ScalarType dtype) {
  return "B" + std::to_string(c.B) + " H" + std::to_string(c.H) + " L" + std::to_string(c.L) + " Dk" +
         std::to_string(c.Dk) + " Dv" + std::to_string(c.Dv) + (dtype == torch::kFloat64 ? " double" : " float");
}

// The largest absolute difference relative to the reference's largest magnitude (at least 1).
double relative_error(const at::Tensor& got, const at::Tensor& ref) {
  return ((got - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item<double>();
}

struct Case {
  int64_t B, H, L, D;
  std::vector<int64_t> lengths;
};

TEST(LinearAttention, MatchesLoopReference) {
  torch::manual_seed(3);
  std::vector<Case> cases = {{1, 1, 1, 4, {1}},          {2, 2, 7, 5, {7, 3}},
                             {3, 1, 67, 8, {67, 40, 0}},  {2, 3, 130, 6, {130, 1}},
                             {1, 2, 64, 4, {64}}};
  for (auto& c : cases)
    for (auto norm : {LinrecNorm::kPaper, LinrecNorm::kCode})
      for (auto form : {LinrecForm::kCausal, LinrecForm::kGlobal}) {
        auto q = torch::randn({c.B, c.H, c.L, c.D}), k = torch::randn({c.B, c.H, c.L, c.D}),
             v = torch::randn({c.B, c.H, c.L, c.D});
        auto pad = padding_mask(c.lengths, c.L);
        auto got = linrec_attention(q, k, v, pad, norm, form);
        ASSERT_TRUE(torch::isfinite(got).all().item<bool>());
        auto want = naive(q, k, v, pad, norm, form);
        EXPECT_TRUE(torch::allclose(real_only(got, pad).to(torch::kFloat64), want, 1e-4, 1e-5))
            << "L=" << c.L << " norm=" << linrec_norm_name(norm) << " form=" << linrec_form_name(form)
            << " max err " << (real_only(got, pad).to(torch::kFloat64) - want).abs().max().item<double>();
      }
}

TEST(LinearAttention, ChunkedProductIsExactForAnyChunk) {
  torch::manual_seed(4);
  auto q = torch::randn({2, 2, 37, 3}, torch::kFloat64), k = torch::randn({2, 2, 37, 3}, torch::kFloat64),
       v = torch::randn({2, 2, 37, 5}, torch::kFloat64);
  auto mask = torch::ones({37, 37}, torch::kFloat64).tril();
  auto want = torch::matmul(torch::matmul(q, k.transpose(-2, -1)) * mask, v);
  for (int64_t chunk : {1, 3, 8, 12, 19, 36, 37, 64})  // 12: 4 chunks of 10; 36: 2 of 19
    EXPECT_TRUE(torch::allclose(causal_linear_attention_reference(q, k, v, chunk), want, 1e-10, 1e-10)) << chunk;
  EXPECT_TRUE(torch::allclose(causal_linear_attention(q, k, v), want, 1e-10, 1e-10));  // the fused kernel
}

// The fused CPU kernels (what causal_linear_attention and global_linear_attention run on the
// CPU) against their ATen references (chunked; q (kᵀ v) by batched products), values and all
// three gradients, in double and float, over shapes that break any blocking (length 1, odd
// lengths and widths, Dk != Dv), zero rows, and non-contiguous inputs; the global product's last
// slot is the causal product's; the causal product from an initial state, with its gradient, and
// a bad initial state named.
TEST(LinearAttention, FusedKernelsMatchTheirReferences) {
  torch::manual_seed(7);
  for (bool global : {false, true})
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (Shape c : std::vector<Shape>{{1, 1, 1, 1, 1}, {2, 3, 7, 5, 3}, {3, 2, 65, 9, 17}, {2, 1, 200, 50, 50},
                                        {1, 2, 130, 16, 8}, {2, 8, 200, 16, 16}}) {
        // Non-contiguous: [B, L, H, D] storage seen as [B, H, L, D], as the models pass heads.
        auto make = [&](int64_t d) {
          return torch::randn({c.B, c.L, c.H, d}, dtype).transpose(1, 2).requires_grad_();
        };
        auto q = make(c.Dk), k = make(c.Dk), v = make(c.Dv);
        {
          torch::NoGradGuard no_grad;  // a zeroed (padded) key row anywhere
          k.select(2, c.L / 2).zero_();
          v.select(2, c.L / 2).zero_();
        }
        auto gout = torch::randn({c.B, c.H, c.L, c.Dv}, dtype);
        auto got = global ? global_linear_attention(q, k, v) : causal_linear_attention(q, k, v);
        ASSERT_TRUE(got.grad_fn());
        const std::string node = global ? "GlobalLinearAttentionFused" : "CausalLinearAttentionFused";
        EXPECT_NE(got.grad_fn()->name().find(node), std::string::npos) << got.grad_fn()->name();
        auto want = global ? global_linear_attention_reference(q, k, v) : causal_linear_attention_reference(q, k, v, 16);
        auto g_got = torch::autograd::grad({got}, {q, k, v}, {gout});
        auto g_want = torch::autograd::grad({want}, {q, k, v}, {gout});
        const double tol = dtype == torch::kFloat64 ? 1e-10 : 2e-5;
        auto close = [&](const at::Tensor& a, const at::Tensor& b) { return relative_error(a, b) <= tol; };
        const std::string where = describe(c, dtype) + (global ? " global" : " causal");
        EXPECT_TRUE(close(got, want)) << where;
        const char* names[] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(close(g_got[i], g_want[i])) << where << " " << names[i];
        if (global) {
          EXPECT_TRUE(close(got.select(2, c.L - 1), causal_linear_attention(q, k, v).select(2, c.L - 1))) << where;
          continue;
        }
        // From an initial state: the kernel starts its walk there, the reference adds q · S0.
        auto s0 = torch::randn({c.B, c.H, c.Dk, c.Dv}, dtype).requires_grad_();
        auto from = causal_linear_attention(q, k, v, 64, s0);
        EXPECT_NE(from.grad_fn()->name().find(node), std::string::npos) << from.grad_fn()->name();
        auto from_want = causal_linear_attention_reference(q, k, v, 16, s0);
        EXPECT_TRUE(close(from, from_want)) << where << " initial state";
        EXPECT_TRUE(close(from_want, want + torch::matmul(q, s0))) << where << " initial state, reference";
        auto gf_got = torch::autograd::grad({from}, {q, k, v, s0}, {gout});
        auto gf_want = torch::autograd::grad({from_want}, {q, k, v, s0}, {gout});
        const char* fnames[] = {"dq", "dk", "dv", "dinitial"};
        for (int i = 0; i < 4; ++i)
          EXPECT_TRUE(close(gf_got[i], gf_want[i])) << where << " initial state " << fnames[i];
      }
  auto q = torch::randn({2, 3, 5, 4}), v = torch::randn({2, 3, 5, 6});
  seqrec::testing::expect_error([&] { causal_linear_attention(q, q, v, 64, torch::randn({2, 3, 6, 4})); },
                                "initial_state must be [B, H, Dh, Dv] = [2, 3, 4, 6]");
  seqrec::testing::expect_error(
      [&] { causal_linear_attention(q, q, v, 64, torch::randn({2, 3, 4, 6}, torch::kFloat64)); },
      "initial_state must be Float");
}

// LinRec's global form with the paper's normalisation, fused on the CPU (linrec_fused.cpp: what
// linrec_attention runs there), against the ATen composition: values and the three gradients,
// in double and float, at the widths it specialises (16, 50, 64) and generic ones (1, 5, Dk !=
// Dv), lengths 1 to 200, left padding, all-padding rows, the heads' strided layout, a query row of
// zeros (its norm clamped) and a key feature that is zero at every real slot (its column norm
// clamped).
TEST(LinearAttention, LinrecGlobalFusedMatchesTheComposition) {
  torch::manual_seed(12);
  struct Fused {
    Shape s;
    std::vector<int64_t> lengths;
  };
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (const Fused& c : std::vector<Fused>{{{1, 1, 1, 1, 1}, {1}},
                                             {{2, 3, 7, 5, 3}, {7, 3}},
                                             {{3, 8, 120, 16, 16}, {120, 57, 0}},
                                             {{2, 2, 10, 16, 16}, {10, 7}},  // groups of 4 rows and 2 or 3 left
                                             {{2, 1, 200, 50, 50}, {200, 131}},
                                             {{2, 2, 65, 64, 64}, {1, 65}},
                                             {{2, 2, 9, 16, 8}, {9, 4}}}) {
      const Shape& s = c.s;
      auto make = [&](int64_t d) {  // [B, L, H, D] storage seen as [B, H, L, D]
        return torch::randn({s.B, s.L, s.H, d}, dtype).transpose(1, 2).requires_grad_();
      };
      auto q = make(s.Dk), k = make(s.Dk), v = make(s.Dv);
      {
        torch::NoGradGuard no_grad;
        q.select(2, s.L - 1).select(1, 0).zero_();  // elu(0) = 0: a zero query row
        if (s.Dk > 1) k.select(3, 1).zero_();       // a key feature zero everywhere
      }
      auto pad = padding_mask(c.lengths, s.L);
      auto gout = torch::randn({s.B, s.H, s.L, s.Dv}, dtype);
      auto got = linrec_attention(q, k, v, pad, LinrecNorm::kPaper, LinrecForm::kGlobal);
      ASSERT_TRUE(got.grad_fn());
      EXPECT_NE(got.grad_fn()->name().find("LinrecGlobalPaperFused"), std::string::npos) << got.grad_fn()->name();
      auto want = linrec_attention_reference(q, k, v, pad, LinrecNorm::kPaper, LinrecForm::kGlobal);
      auto g_got = torch::autograd::grad({got}, {q, k, v}, {gout});
      auto g_want = torch::autograd::grad({want}, {q, k, v}, {gout});
      const double tol = dtype == torch::kFloat64 ? 1e-10 : 3e-5;
      const std::string where = describe(s, dtype);
      EXPECT_LE(relative_error(got, want), tol) << where;
      const char* names[] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) EXPECT_LE(relative_error(g_got[i], g_want[i]), tol) << where << " " << names[i];
      if (s.Dk != s.Dv) continue;
      // The packed entry (the model's [B, L, 3·D] projection in, [B, L, D] out) on the same numbers.
      auto qkv = torch::cat({q, k, v}, 1).detach().transpose(1, 2).reshape({s.B, s.L, 3 * s.H * s.Dk});
      qkv.requires_grad_();
      auto packed = linrec_attention_packed(qkv, s.H, pad, LinrecNorm::kPaper, LinrecForm::kGlobal);
      EXPECT_NE(packed.grad_fn()->name().find("LinrecGlobalPaperPacked"), std::string::npos) << packed.grad_fn()->name();
      auto merged = [&](const at::Tensor& t) { return t.transpose(1, 2).reshape({s.B, s.L, s.H * s.Dk}); };
      EXPECT_LE(relative_error(packed, merged(want)), tol) << where << " packed";
      auto g_packed = torch::autograd::grad({packed}, {qkv}, {merged(gout)})[0];
      EXPECT_LE(relative_error(g_packed, torch::cat({merged(g_want[0]), merged(g_want[1]), merged(g_want[2])}, 2)), tol)
          << where << " packed dqkv";
    }
}

// The last slot alone (a model's last block under the last-slot objective): its query [B, D]
// against every slot's packed keys and values gives the packed global op's last slot, values and
// the projection's gradient, under both normalisations (the paper's through the fused kernel's
// one-query entry, the code's through the reference with one query row); an all-padding row
// gives finite numbers.
TEST(LinearAttention, LinrecLastSlotEqualsThePackedOpsLastSlot) {
  torch::manual_seed(14);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (auto norm : {LinrecNorm::kPaper, LinrecNorm::kCode})
      for (const Case& c : std::vector<Case>{{1, 1, 1, 1, {1}},
                                             {3, 8, 120, 16, {120, 57, 0}},
                                             {2, 1, 200, 50, {200, 131}},
                                             {2, 2, 9, 5, {9, 4}}}) {
        const int64_t D = c.H * c.D;
        const std::string where = describe({c.B, c.H, c.L, c.D, c.D}, dtype) + " " + linrec_norm_name(norm);
        auto qkv = torch::randn({c.B, c.L, 3 * D}, dtype).requires_grad_();
        auto pad = padding_mask(c.lengths, c.L);
        auto real = pad.select(1, c.L - 1).logical_not().unsqueeze(1);  // [B, 1]: the last slot is real
        auto gout = torch::randn({c.B, D}, dtype) * real;
        auto got = linrec_attention_last(qkv.select(1, c.L - 1).narrow(1, 0, D), qkv.narrow(2, D, 2 * D), c.H, pad, norm);
        ASSERT_TRUE(got.grad_fn());
        EXPECT_EQ(got.grad_fn()->name().find("LinrecGlobalPaperLast") != std::string::npos, norm == LinrecNorm::kPaper)
            << where << ": " << got.grad_fn()->name();
        EXPECT_TRUE(torch::isfinite(got).all().item<bool>()) << where;
        auto want = linrec_attention_packed(qkv, c.H, pad, norm, LinrecForm::kGlobal).select(1, c.L - 1);
        const double tol = dtype == torch::kFloat64 ? 1e-10 : 3e-5;
        EXPECT_LE(relative_error(got * real, want * real), tol) << where;
        auto g_got = torch::autograd::grad({got}, {qkv}, {gout})[0];
        auto g_want = torch::autograd::grad({want}, {qkv}, {gout})[0];
        EXPECT_LE(relative_error(g_got, g_want), tol) << where << " dqkv";
      }
  {
    // With the fused kernels off the paper's normalisation takes the reference with one query row.
    const seqrec::testing::ScopedFusedKernels off(false);
    auto qkv = torch::randn({3, 9, 3 * 16}, torch::kFloat64);
    auto pad = padding_mask({9, 4, 1}, 9);
    auto got = linrec_attention_last(qkv.select(1, 8).narrow(1, 0, 16), qkv.narrow(2, 16, 32), 2, pad, LinrecNorm::kPaper);
    auto want = linrec_attention_packed(qkv, 2, pad, LinrecNorm::kPaper, LinrecForm::kGlobal).select(1, 8);
    EXPECT_LE(relative_error(got, want), 1e-12);
  }
  auto q = torch::randn({2, 8}), kv = torch::randn({2, 5, 16});
  auto pad = padding_mask({5, 2}, 5);
  EXPECT_THROW(linrec_attention_last(q, kv.narrow(2, 0, 15), 2, pad, LinrecNorm::kPaper), c10::Error);
  EXPECT_THROW(linrec_attention_last(q, kv, 3, pad, LinrecNorm::kPaper), c10::Error);
  EXPECT_THROW(linrec_attention_last(q, kv, 2, pad.narrow(1, 0, 4), LinrecNorm::kPaper), c10::Error);
}

// The bfloat16 entries (`--matmul_precision medium`): the projections' bfloat16 products and float32
// biases in, bfloat16 out. The fused kernel against the composition it replaces (the float32 entry
// on product.to(float) + bias, rounded), in the global form with the paper's normalisation: values
// and the products' gradients bit for bit, the biases' gradients to float rounding and the same at
// 1 and 2 threads; widths 1, 5, 16, 50, 64, left padding and an all-padding row. The causal form,
// the code's normalisation and the fused kernels off take the composition itself; bad arguments
// are named.
TEST(LinearAttention, LinrecBf16EntriesEqualTheComposition) {
  const int prev = at::get_num_threads();
  auto bf16 = [](const at::Tensor& t) { return t.to(torch::kBFloat16); };
  at::Tensor first_bias_grad;
  for (int threads : {1, 2})
    for (const Case& c : std::vector<Case>{{1, 1, 1, 1, {1}},
                                           {2, 3, 7, 5, {7, 3}},
                                           {3, 8, 120, 16, {120, 57, 0}},
                                           {2, 1, 200, 50, {200, 131}},
                                           {2, 2, 65, 64, {1, 65}}}) {
      at::set_num_threads(threads);
      torch::manual_seed(31);
      const int64_t D = c.H * c.D;
      const std::string where = "B" + std::to_string(c.B) + " H" + std::to_string(c.H) + " L" + std::to_string(c.L) +
                                " W" + std::to_string(c.D) + " threads " + std::to_string(threads);
      auto pad = padding_mask(c.lengths, c.L);
      auto product = bf16(torch::randn({c.B, c.L, 3 * D})).requires_grad_();
      auto bias = torch::randn({3 * D}).requires_grad_();
      auto gout = bf16(torch::randn({c.B, c.L, D}));
      auto got = linrec_attention_packed_bf16(product, bias, c.H, pad, LinrecNorm::kPaper, LinrecForm::kGlobal);
      ASSERT_EQ(got.scalar_type(), torch::kBFloat16) << where;
      EXPECT_NE(got.grad_fn()->name().find("LinrecGlobalPaperPackedBf16"), std::string::npos) << got.grad_fn()->name();
      auto want = linrec_attention_packed(product.to(torch::kFloat) + bias, c.H, pad, LinrecNorm::kPaper,
                                          LinrecForm::kGlobal).to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(got, want)) << where << ": " << relative_error(got.to(torch::kFloat), want.to(torch::kFloat));
      auto g_got = torch::autograd::grad({got}, {product, bias}, {gout});
      auto g_want = torch::autograd::grad({want}, {product, bias}, {gout});
      EXPECT_EQ(g_got[0].scalar_type(), torch::kBFloat16) << where;
      EXPECT_TRUE(torch::equal(g_got[0], g_want[0])) << where << " dproduct";
      EXPECT_LE(relative_error(g_got[1], g_want[1]), 1e-5) << where << " dbias";
      if (c.D == 16 && threads == 1) first_bias_grad = g_got[1];
      if (c.D == 16 && threads == 2) {
        EXPECT_TRUE(torch::equal(g_got[1], first_bias_grad)) << where << ": thread count";
      }

      // The last slot alone: its query's product and bias, every slot's keys' and values'.
      auto q = bf16(torch::randn({c.B, D})).requires_grad_();
      auto q_bias = torch::randn({D}).requires_grad_();
      auto kv = bf16(torch::randn({c.B, c.L, 2 * D})).requires_grad_();
      auto kv_bias = torch::randn({2 * D}).requires_grad_();
      auto glast = bf16(torch::randn({c.B, D}));
      auto last = linrec_attention_last_bf16(q, q_bias, kv, kv_bias, c.H, pad, LinrecNorm::kPaper);
      ASSERT_EQ(last.scalar_type(), torch::kBFloat16) << where;
      EXPECT_NE(last.grad_fn()->name().find("LinrecGlobalPaperLastBf16"), std::string::npos) << last.grad_fn()->name();
      auto last_want = linrec_attention_last(q.to(torch::kFloat) + q_bias, kv.to(torch::kFloat) + kv_bias, c.H, pad,
                                             LinrecNorm::kPaper).to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(last, last_want)) << where << " last";
      auto gl_got = torch::autograd::grad({last}, {q, q_bias, kv, kv_bias}, {glast});
      auto gl_want = torch::autograd::grad({last_want}, {q, q_bias, kv, kv_bias}, {glast});
      EXPECT_TRUE(torch::equal(gl_got[0], gl_want[0])) << where << " last dq";
      EXPECT_TRUE(torch::equal(gl_got[2], gl_want[2])) << where << " last dkv";
      EXPECT_LE(relative_error(gl_got[1], gl_want[1]), 1e-5) << where << " last dq_bias";
      EXPECT_LE(relative_error(gl_got[3], gl_want[3]), 1e-5) << where << " last dkv_bias";
    }
  at::set_num_threads(prev);

  // Elsewhere the composition itself: the causal form, the code's normalisation, the kernels off.
  auto product = torch::randn({2, 9, 48}).to(torch::kBFloat16);
  auto bias = torch::randn({48});
  auto pad = padding_mask({9, 4}, 9);
  for (auto [norm, form] : {std::pair{LinrecNorm::kPaper, LinrecForm::kCausal},
                            std::pair{LinrecNorm::kCode, LinrecForm::kGlobal}}) {
    auto got = linrec_attention_packed_bf16(product, bias, 2, pad, norm, form);
    auto want = linrec_attention_packed(product.to(torch::kFloat) + bias, 2, pad, norm, form).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(got, want)) << linrec_norm_name(norm) << " " << linrec_form_name(form);
  }
  {
    const seqrec::testing::ScopedFusedKernels off(false);
    auto leaf = product.clone().requires_grad_();
    auto got = linrec_attention_packed_bf16(leaf, bias, 2, pad, LinrecNorm::kPaper, LinrecForm::kGlobal);
    ASSERT_TRUE(got.grad_fn());
    EXPECT_EQ(got.grad_fn()->name().find("Bf16"), std::string::npos) << got.grad_fn()->name();
    auto want = linrec_attention_packed(product.to(torch::kFloat) + bias, 2, pad, LinrecNorm::kPaper,
                                        LinrecForm::kGlobal).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(got, want));
  }
  seqrec::testing::expect_error([&] { linrec_attention_packed_bf16(product.to(torch::kFloat), bias, 2, pad,
                                                                   LinrecNorm::kPaper, LinrecForm::kGlobal); },
                                "bfloat16 product");
  seqrec::testing::expect_error([&] { linrec_attention_packed_bf16(product, bias.narrow(0, 0, 47), 2, pad,
                                                                   LinrecNorm::kPaper, LinrecForm::kGlobal); },
                                "float32 bias");
  seqrec::testing::expect_error([&] { linrec_attention_packed_bf16(product, bias, 3, pad, LinrecNorm::kPaper,
                                                                   LinrecForm::kGlobal); },
                                "split into heads");
  seqrec::testing::expect_error([&] { linrec_attention_last_bf16(product.select(1, 0).narrow(1, 0, 16), bias.narrow(0, 0, 16),
                                                                 product.narrow(2, 0, 30), bias.narrow(0, 0, 30), 2,
                                                                 pad, LinrecNorm::kPaper); },
                                "kv [B, L, 2·D]");
}

// Pad keys (--linrec_pad_keys: count[b] copies of one key and value in every sequence b) against
// the copies themselves: each row widened in front by its copies, unmasked, and every key of the
// widened rows in the op without pad keys (and, in double, the loop-level reference). Both
// normalisations and forms, the fused kernels (the global form with the paper's normalisation) and
// the composition, double and float, counts 0, 1 and more than the row's length, left padding
// and an all-padding row; values and the gradients of q, k, v and of the pad key and value. The
// packed, last-slot and bfloat16 entries give what the q, k, v entry gives; bad pad keys are named.
TEST(LinearAttention, LinrecPadKeysEqualTheirCopies) {
  torch::manual_seed(41);
  // Flat, not a Case inside: GCC 12 warns (falsely) on the nested braced vectors otherwise.
  struct PadCase {
    int64_t B, H, L, D;
    std::vector<int64_t> lengths, counts;
  };
  const std::vector<PadCase> cases{{1, 1, 1, 1, {1}, {3}},
                                   {3, 2, 7, 5, {7, 3, 0}, {0, 4, 9}},
                                   {2, 3, 10, 16, {10, 6}, {1, 13}},
                                   {2, 1, 30, 50, {30, 11}, {0, 19}}};
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (auto norm : {LinrecNorm::kPaper, LinrecNorm::kCode})
      for (auto form : {LinrecForm::kCausal, LinrecForm::kGlobal})
        for (const PadCase& pc : cases) {
          const int64_t B = pc.B, H = pc.H, L = pc.L, D = pc.D;
          const int64_t P = *std::max_element(pc.counts.begin(), pc.counts.end()), W = P + L;
          const std::string where = describe({B, H, L, D, D}, dtype) + " " + linrec_norm_name(norm) + " " +
                                    linrec_form_name(form);
          auto make = [&](std::vector<int64_t> shape) { return torch::randn(shape, dtype).requires_grad_(); };
          auto q = make({B, H, L, D}), k = make({B, H, L, D}), v = make({B, H, L, D});
          auto pk = make({H, D}), pv = make({H, D});
          auto count = torch::tensor(pc.counts, torch::kLong);
          auto pad = padding_mask(pc.lengths, L);
          // The copies: row b gets P - count[b] masked slots, then count[b] copies, then its L slots.
          std::vector<at::Tensor> kw, vw;
          auto wpad = torch::ones({B, W}, torch::kBool);
          for (int64_t b = 0; b < B; ++b) {
            const int64_t n = pc.counts[b];
            kw.push_back(torch::cat({torch::zeros({H, P - n, D}, dtype), pk.unsqueeze(1).expand({H, n, D}), k[b]}, 1));
            vw.push_back(torch::cat({torch::zeros({H, P - n, D}, dtype), pv.unsqueeze(1).expand({H, n, D}), v[b]}, 1));
            wpad[b].narrow(0, P - n, n).fill_(false);
            wpad[b].narrow(0, P, L).copy_(pad[b]);
          }
          auto kc = torch::stack(kw), vc = torch::stack(vw);
          auto qc = torch::cat({torch::zeros({B, H, P, D}, dtype), q}, 2);
          auto real = pad.logical_not().view({B, 1, L, 1}).to(dtype);
          auto real_rows = pad.logical_not().view({B, L, 1}).to(dtype);  // real as the packed rows have it
          auto gout = torch::randn({B, H, L, D}, dtype) * real;
          const LinrecPadKeys pad_keys{pk, pv, count};
          auto got = linrec_attention(q, k, v, pad, norm, form, pad_keys);
          const bool fused = norm == LinrecNorm::kPaper && form == LinrecForm::kGlobal;
          EXPECT_EQ(got.grad_fn()->name().find("LinrecGlobalPaperFused") != std::string::npos, fused)
              << where << ": " << got.grad_fn()->name();
          auto want = linrec_attention(qc, kc, vc, wpad, norm, form).narrow(2, P, L);
          const double tol = dtype == torch::kFloat64 ? 1e-10 : 5e-5;
          EXPECT_TRUE(torch::isfinite(got).all().item<bool>()) << where;
          EXPECT_LE(relative_error(got * real, want * real), tol) << where;
          if (dtype == torch::kFloat64) {
            auto loops = naive(qc, kc, vc, wpad, norm, form).narrow(2, P, L);
            EXPECT_LE(relative_error(got * real, loops), 1e-10) << where << " loops";
          }
          auto g_got = torch::autograd::grad({got}, {q, k, v, pk, pv}, {gout});
          auto g_want = torch::autograd::grad({want}, {q, k, v, pk, pv}, {gout});
          const char* names[] = {"dq", "dk", "dv", "dpad_key", "dpad_value"};
          for (int i = 0; i < 5; ++i) EXPECT_LE(relative_error(g_got[i], g_want[i]), tol) << where << " " << names[i];
          if (fused) {  // the composition agrees with the kernel
            auto ref = linrec_attention_reference(q, k, v, pad, norm, form, pad_keys);
            EXPECT_LE(relative_error(ref * real, want * real), tol) << where << " reference";
          }

          // The packed entry on the same numbers, and the last slot alone.
          auto merged = [&](const at::Tensor& t) { return t.transpose(1, 2).reshape({B, L, H * D}); };
          auto qkv = torch::cat({merged(q), merged(k), merged(v)}, 2).detach().requires_grad_();
          auto kvp = torch::cat({pk.reshape(-1), pv.reshape(-1)}).detach().requires_grad_();
          auto packed_keys = linrec_pad_keys_packed(kvp, H, count);
          auto packed = linrec_attention_packed(qkv, H, pad, norm, form, packed_keys);
          EXPECT_LE(relative_error(packed * real_rows, merged(got * real)), tol) << where << " packed";
          auto g_packed = torch::autograd::grad({packed}, {qkv, kvp}, {merged(gout)}, /*retain_graph=*/true);
          EXPECT_LE(relative_error(g_packed[0], torch::cat({merged(g_got[0]), merged(g_got[1]), merged(g_got[2])}, 2)),
                    tol) << where << " packed dqkv";
          EXPECT_LE(relative_error(g_packed[1], torch::cat({g_got[3].reshape(-1), g_got[4].reshape(-1)})), tol)
              << where << " packed dkv";
          if (form == LinrecForm::kGlobal) {
            auto last_real = pad.select(1, L - 1).logical_not().unsqueeze(1).to(dtype);
            auto last = linrec_attention_last(qkv.select(1, L - 1).narrow(1, 0, H * D), qkv.narrow(2, H * D, 2 * H * D),
                                              H, pad, norm, packed_keys);
            EXPECT_LE(relative_error(last * last_real, packed.select(1, L - 1) * last_real), tol) << where << " last";
            auto gl = torch::randn({B, H * D}, dtype) * last_real;
            auto g_last = torch::autograd::grad({last}, {qkv, kvp}, {gl});
            auto g_last_want = torch::autograd::grad({packed.select(1, L - 1)}, {qkv, kvp}, {gl});
            EXPECT_LE(relative_error(g_last[0], g_last_want[0]), tol) << where << " last dqkv";
            EXPECT_LE(relative_error(g_last[1], g_last_want[1]), tol) << where << " last dkv";
          }

          // bfloat16 entries: the fused kernel's values and products' gradients are the
          // composition's bit for bit; the float pad keys' gradients to float rounding.
          if (dtype != torch::kFloat32) continue;
          auto product = qkv.detach().to(torch::kBFloat16).requires_grad_();
          auto bias = torch::randn({3 * H * D}).requires_grad_();
          auto kvf = kvp.detach().requires_grad_();
          auto bkeys = linrec_pad_keys_packed(kvf, H, count);
          auto b_got = linrec_attention_packed_bf16(product, bias, H, pad, norm, form, bkeys);
          auto b_want = linrec_attention_packed(product.to(torch::kFloat) + bias, H, pad, norm, form, bkeys)
                            .to(torch::kBFloat16);
          EXPECT_TRUE(torch::equal(b_got * real_rows.to(torch::kBFloat16), b_want * real_rows.to(torch::kBFloat16)))
              << where << " bf16";
          auto bg = merged(gout).to(torch::kBFloat16);
          auto bg_got = torch::autograd::grad({b_got}, {product, bias, kvf}, {bg});
          auto bg_want = torch::autograd::grad({b_want}, {product, bias, kvf}, {bg});
          EXPECT_TRUE(torch::equal(bg_got[0], bg_want[0])) << where << " bf16 dproduct";
          EXPECT_LE(relative_error(bg_got[1], bg_want[1]), 1e-5) << where << " bf16 dbias";
          EXPECT_LE(relative_error(bg_got[2], bg_want[2]), 1e-5) << where << " bf16 dkv";
          if (form == LinrecForm::kGlobal) {
            auto qp = product.detach().select(1, L - 1).narrow(1, 0, H * D).contiguous().requires_grad_();
            auto kvb = product.detach().narrow(2, H * D, 2 * H * D).contiguous().requires_grad_();
            auto qb = bias.detach().narrow(0, 0, H * D).contiguous();
            auto kvbias = bias.detach().narrow(0, H * D, 2 * H * D).contiguous();
            auto l_got = linrec_attention_last_bf16(qp, qb, kvb, kvbias, H, pad, norm, bkeys);
            auto l_want = linrec_attention_last(qp.to(torch::kFloat) + qb, kvb.to(torch::kFloat) + kvbias, H, pad, norm,
                                                bkeys).to(torch::kBFloat16);
            EXPECT_TRUE(torch::equal(l_got, l_want)) << where << " bf16 last";
            auto lg = torch::randn({B, H * D}).to(torch::kBFloat16);
            auto lg_got = torch::autograd::grad({l_got}, {qp, kvb, kvf}, {lg});
            auto lg_want = torch::autograd::grad({l_want}, {qp, kvb, kvf}, {lg});
            EXPECT_TRUE(torch::equal(lg_got[0], lg_want[0])) << where << " bf16 last dq";
            EXPECT_TRUE(torch::equal(lg_got[1], lg_want[1])) << where << " bf16 last dkv";
            EXPECT_LE(relative_error(lg_got[2], lg_want[2]), 1e-5) << where << " bf16 last dpad";
          }
        }

  auto q = torch::randn({2, 2, 5, 4});
  auto pad = padding_mask({5, 2}, 5);
  auto key = torch::randn({2, 4});
  auto count = torch::tensor(std::vector<int64_t>{1, 3}, torch::kLong);
  auto run = [&](const LinrecPadKeys& p) {
    linrec_attention(q, q, q, pad, LinrecNorm::kPaper, LinrecForm::kGlobal, p);
  };
  seqrec::testing::expect_error([&] { run({key.narrow(1, 0, 3), key, count}); }, "pad_keys: key must be [H, Dk]");
  seqrec::testing::expect_error([&] { run({key, key.to(torch::kFloat64), count}); }, "pad_keys: key and value must be");
  seqrec::testing::expect_error([&] { run({key, key, count.narrow(0, 0, 1)}); }, "pad_keys: count must be int64 [B]");
  seqrec::testing::expect_error([&] { run({key, key, count.to(torch::kInt)}); }, "pad_keys: count must be int64 [B]");
  seqrec::testing::expect_error([&] { run({key, key, count - 2}); }, "pad_keys: count must be >= 0");
  seqrec::testing::expect_error([&] { linrec_pad_keys_packed(torch::randn({14}), 2, count); },
                                "pad_keys: kv must be [2·D]");
}

// The fused LinRec kernel's float exp (its ELU) against std::exp in double, every 1/1024 from
// -87 to 0 and the ends: within 2 ulp of the true value; below -87 it holds exp(-87).
TEST(LinearAttention, FloatExpIsWithinTwoUlp) {
  double worst = 0;
  for (int i = 0; i <= 87 * 1024; ++i) {
    const float x = -static_cast<float>(i) / 1024.0f;
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(want), 1.0f) - static_cast<float>(want);
    worst = std::max(worst, std::abs(exp_nonpositive(x) - want) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-200.0f), exp_nonpositive(-87.0f));
  EXPECT_GT(exp_nonpositive(-87.0f), 0.0f);
}

// The packed entry off the fused kernel (the causal form, or fused kernels off) splits the heads
// and runs linrec_attention: the same numbers as calling it on the split heads.
TEST(LinearAttention, PackedEntrySplitsTheHeadsElsewhere) {
  torch::manual_seed(13);
  const int64_t B = 2, L = 11, H = 2, W = 4;
  auto qkv = torch::randn({B, L, 3 * H * W}, torch::kFloat64);
  auto pad = padding_mask({11, 6}, L);
  auto split = qkv.view({B, L, 3, H, W}).permute({2, 0, 3, 1, 4});
  for (auto norm : {LinrecNorm::kPaper, LinrecNorm::kCode}) {
    auto got = linrec_attention_packed(qkv, H, pad, norm, LinrecForm::kCausal);
    auto want = linrec_attention(split[0], split[1], split[2], pad, norm, LinrecForm::kCausal);
    EXPECT_TRUE(torch::allclose(got, want.transpose(1, 2).reshape({B, L, H * W}), 1e-12, 1e-12));
  }
  EXPECT_THROW(linrec_attention_packed(qkv.narrow(2, 0, 3 * H * W - 1), H, pad, LinrecNorm::kPaper,
                                       LinrecForm::kGlobal),
               c10::Error);
  EXPECT_THROW(linrec_attention_packed(qkv, 3, pad, LinrecNorm::kPaper, LinrecForm::kGlobal), c10::Error);
  EXPECT_THROW(linrec_attention_packed(qkv, H, pad.narrow(1, 0, L - 1), LinrecNorm::kPaper, LinrecForm::kGlobal),
               c10::Error);
}

TEST(LinearAttention, FusedKernelGradientsMatchCentralDifferences) {
  torch::manual_seed(8);
  auto q = torch::randn({2, 2, 11, 3}, torch::kFloat64).requires_grad_();
  auto k = torch::randn({2, 2, 11, 3}, torch::kFloat64).requires_grad_();
  auto v = torch::randn({2, 2, 11, 4}, torch::kFloat64).requires_grad_();
  auto w = torch::randn({2, 2, 11, 4}, torch::kFloat64);
  seqrec::testing::expect_gradients_match_central_differences(
      [&] { return (causal_linear_attention(q, k, v) * w).sum(); }, {q, k, v}, 2);
  seqrec::testing::expect_gradients_match_central_differences(
      [&] { return (global_linear_attention(q, k, v) * w).sum(); }, {q, k, v}, 2);
}

TEST(LinearAttention, FusedKernelEmptyShapes) {
  for (auto [L, D] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {5, 0}}) {
    auto q = torch::randn({2, 1, L, D}), v = torch::randn({2, 1, L, 3});
    for (const auto& out : {causal_linear_attention(q, q, v), global_linear_attention(q, q, v)}) {
      EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 1, L, 3}));
      EXPECT_EQ(out.abs().sum().item<double>(), 0.0);
    }
  }
  // LinRec's fused op (global, paper) on no slots and on zero-width heads: empty or zero, finite.
  auto none = linrec_attention(torch::randn({2, 1, 0, 4}), torch::randn({2, 1, 0, 4}), torch::randn({2, 1, 0, 4}),
                               torch::zeros({2, 0}, torch::kBool), LinrecNorm::kPaper, LinrecForm::kGlobal);
  EXPECT_EQ(none.sizes(), (std::vector<int64_t>{2, 1, 0, 4}));
  auto packed = linrec_attention_packed(torch::randn({2, 5, 0}), 1, torch::zeros({2, 5}, torch::kBool),
                                        LinrecNorm::kPaper, LinrecForm::kGlobal);
  EXPECT_EQ(packed.sizes(), (std::vector<int64_t>{2, 5, 0}));
}

// The CUDA kernel's phases emulated on the CPU (linear_attention_kernel.h: every block of both
// launches, each phase for all 256 threads before the next) against the CPU's fused kernel:
// values, and the three gradients as the CUDA op's backward composes them (kBackwardProducts),
// over widths that leave lanes and warps idle, every rows-per-thread instantiation (widths
// 1-256), lengths of one slot, of partial and of several staged chunks, Dk != Dv; each shape in
// one segment and in segments of 16, 48 and 64 slots (partial last segments; segment sums carried
// across up to 13 segments). What this cannot show (the hardware's barriers, shared-memory
// limits, launch errors) is CudaKernelMatchesCpuKernel's, on a GPU.
template <typename T>
at::Tensor emulated_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, bool reverse,
                            int64_t seg_len) {
  namespace lk = seqrec::ops::cuda::linear_kernel;
  auto ac = a.contiguous(), bc = b.contiguous(), cc = c.contiguous();
  const int64_t n = a.size(0) * a.size(1), L = a.size(2), dk = a.size(3), dv = c.size(3);
  auto out = torch::full({a.size(0), a.size(1), L, dv}, std::nan(""), c.options());
  // NaN-filled, so that a segment sum read before it is written poisons the outputs.
  auto sums = torch::full({std::max<int64_t>(1, lk::workspace_elements(n, L, dk, dv, seg_len))}, std::nan(""),
                          c.options());
  const lk::Args<T> args{ac.data_ptr<T>(),
                         bc.data_ptr<T>(),
                         cc.data_ptr<T>(),
                         out.data_ptr<T>(),
                         static_cast<int>(L),
                         static_cast<int>(dk),
                         static_cast<int>(dv),
                         reverse,
                         static_cast<int>(std::min(seg_len, L)),
                         sums.data_ptr<T>()};
  lk::emulate(args, n);
  return out;
}

TEST(LinearAttention, CudaKernelLogicMatchesCpuKernel) {
  torch::manual_seed(10);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (Shape c : std::vector<Shape>{{1, 1, 1, 1, 1},
                                      {2, 3, 7, 5, 3},
                                      {1, 2, 16, 16, 16},
                                      {2, 1, 33, 9, 17},
                                      {2, 1, 200, 50, 50},
                                      {1, 2, 40, 64, 40},
                                      {1, 1, 21, 100, 33},
                                      {1, 1, 17, 256, 256},
                                      {1, 1, 19, 200, 3},
                                      {1, 1, 19, 3, 200}}) {
      auto q = torch::randn({c.B, c.H, c.L, c.Dk}, dtype).requires_grad_();
      auto k = torch::randn({c.B, c.H, c.L, c.Dk}, dtype).requires_grad_();
      auto v = torch::randn({c.B, c.H, c.L, c.Dv}, dtype).requires_grad_();
      auto gout = torch::randn({c.B, c.H, c.L, c.Dv}, dtype);
      auto want = causal_linear_attention(q, k, v);  // the CPU's fused kernel
      auto g_want = torch::autograd::grad({want}, {q, k, v}, {gout});
      const at::Tensor operands[4] = {q.detach(), k.detach(), v.detach(), gout};
      const double tol = dtype == torch::kFloat64 ? 1e-10 : 3e-5;
      auto close = [&](const at::Tensor& got, const at::Tensor& ref) {
        return torch::isfinite(got).all().item<bool>() &&  // every output slot written
               relative_error(got, ref) <= tol;
      };
      for (int64_t seg_len : {c.L, int64_t{16}, int64_t{48}, int64_t{64}}) {
        if (seg_len < c.L && c.Dk * c.Dv > 64 * 64) continue;  // the widest shapes once, in one segment
        auto product = [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& cc, bool reverse) {
          return dtype == torch::kFloat64 ? emulated_product<double>(a, b, cc, reverse, seg_len)
                                          : emulated_product<float>(a, b, cc, reverse, seg_len);
        };
        const std::string where = describe(c, dtype) + " seg_len " + std::to_string(seg_len);
        EXPECT_TRUE(close(product(operands[0], operands[1], operands[2], false), want.detach())) << where;
        const char* names[] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; ++i) {
          const auto& p = seqrec::ops::cuda::kBackwardProducts[i];
          EXPECT_TRUE(close(product(operands[p.a], operands[p.b], operands[p.c], p.reverse), g_want[i]))
              << where << " " << names[i];
        }
      }
    }
}

// How the launcher splits sequences into segments: only short grids, never below kMinSegment
// slots or past kMaxSegments, each a multiple of the staged chunk, covering L exactly.
TEST(LinearAttention, CudaSegmentPlan) {
  namespace lk = seqrec::ops::cuda::linear_kernel;
  // A grid that fills the device, or a sequence too short to split: one segment.
  EXPECT_EQ(lk::plan_segment_len(128 * 8, 200, 16, 132), 200);   // LinRec's paper setting: 1,024 blocks
  EXPECT_EQ(lk::plan_segment_len(6, 100, 50, 132), 100);         // under 2 x kMinSegment
  EXPECT_EQ(lk::workspace_elements(6, 100, 50, 50, 100), 0);
  for (auto [n, L, dv, sms] : std::vector<std::array<int64_t, 4>>{
           {6, 4096, 50, 132}, {25, 1024, 50, 132}, {128, 200, 50, 132}, {1, 1000, 8, 132}, {1, 131, 1, 1}, {1, 1 << 20, 256, 132}}) {
    const int64_t len = lk::plan_segment_len(n, L, dv, sms), segs = (L + len - 1) / len;
    const std::string where = "n " + std::to_string(n) + " L " + std::to_string(L) + " dv " + std::to_string(dv);
    EXPECT_GE(len, lk::kMinSegment) << where;
    EXPECT_EQ(len % lk::kSteps, 0) << where;
    EXPECT_GT(segs, 1) << where;
    EXPECT_LE(segs, lk::kMaxSegments) << where;
    EXPECT_EQ(seqrec::ops::cuda::segments(L, len), segs) << where;
    // About kBlocksPerSm blocks per multiprocessor (less at most what rounding segments up to
    // whole chunks costs), unless a bound on the segments stops it.
    const int64_t blocks = n * lk::tiles(dv), target = lk::kBlocksPerSm * sms;
    if ((target + blocks - 1) / blocks <= std::min<int64_t>(lk::kMaxSegments, L / lk::kMinSegment)) {
      EXPECT_GE(4 * blocks * segs, 3 * target) << where;
    }
    EXPECT_EQ(lk::workspace_elements(n, L, 64, dv, len), blocks * segs * 64 * lk::kLanes) << where;
  }
  EXPECT_EQ(lk::plan_segment_len(6, 4096, 50, 132), 96);  // 43 segments of 96 slots: 516 blocks
}

// The CUDA kernel (what causal_linear_attention runs on a CUDA device) against the CPU's fused
// kernel on the same inputs: values and all three gradients, in double and float, over widths
// that leave lanes and warps idle (1, 5, 50, 200), the widest it takes (256) and one it leaves
// to the reference (300), lengths of one slot, of partial and many staged chunks, Dk != Dv,
// zeroed rows, non-contiguous inputs; the launcher splits the longer shapes of few sequences into
// segments (200, 300 and 1,000 slots: 3, 4 and 13 of them); then causality on the device. Runs
// on a GPU machine only.
TEST(LinearAttention, CudaKernelMatchesCpuKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  torch::manual_seed(9);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (Shape c : std::vector<Shape>{{1, 1, 1, 1, 1},
                                      {2, 3, 7, 5, 3},
                                      {3, 2, 65, 9, 17},
                                      {4, 1, 200, 50, 50},
                                      {2, 8, 200, 16, 16},
                                      {1, 2, 300, 64, 40},
                                      {1, 1, 33, 128, 128},
                                      {1, 1, 17, 256, 256},
                                      {1, 1, 19, 200, 3},
                                      {1, 1, 19, 3, 200},
                                      {1, 1, 1000, 8, 8},
                                      {2, 1, 9, 300, 8}}) {
      auto make = [&](int64_t d) { return torch::randn({c.B, c.L, c.H, d}, dtype).transpose(1, 2); };
      auto q = make(c.Dk), k = make(c.Dk), v = make(c.Dv);
      k.select(2, c.L / 2).zero_();
      v.select(2, c.L / 2).zero_();
      auto gout = torch::randn({c.B, c.H, c.L, c.Dv}, dtype);
      auto run = [&](const torch::Device& device) {
        auto qd = q.to(device).detach().requires_grad_(), kd = k.to(device).detach().requires_grad_(),
             vd = v.to(device).detach().requires_grad_();
        auto out = causal_linear_attention(qd, kd, vd);
        auto grads = torch::autograd::grad({out}, {qd, kd, vd}, {gout.to(device)});
        return std::make_pair(out, grads);
      };
      auto [want, g_want] = run(torch::kCPU);
      auto [got, g_got] = run(torch::kCUDA);
      const std::string where = describe(c, dtype);
      ASSERT_TRUE(got.is_cuda()) << where;
      if (c.Dk <= 256 && c.Dv <= 256) {
        EXPECT_NE(got.grad_fn()->name().find("CausalLinearAttentionCuda"), std::string::npos)
            << where << ": " << got.grad_fn()->name();
      }
      // Both kernels sum in slot order; float rounding differs only by the order of the
      // per-warp partial sums, so the tolerance is relative to the largest magnitude.
      const double tol = dtype == torch::kFloat64 ? 1e-10 : 3e-5;
      auto close = [&](const at::Tensor& a, const at::Tensor& b) { return relative_error(a.cpu(), b) <= tol; };
      EXPECT_TRUE(close(got, want)) << where;
      const char* names[] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(close(g_got[i], g_want[i])) << where << " " << names[i];
    }

  // Causality on the device, in one segment (L 97) and across segments (L 300: 8 blocks, so
  // segments of 80 slots): changing slots >= c leaves slots < c bit for bit.
  for (auto [L, c] : std::vector<std::pair<int64_t, int64_t>>{{97, 40}, {300, 140}}) {
    auto q = torch::randn({2, 2, L, 50}, torch::kCUDA), k = torch::randn({2, 2, L, 50}, torch::kCUDA),
         v = torch::randn({2, 2, L, 50}, torch::kCUDA);
    auto before = causal_linear_attention(q, k, v);
    auto k2 = k.clone(), v2 = v.clone(), q2 = q.clone();
    k2.narrow(2, c, L - c).normal_();
    v2.narrow(2, c, L - c).normal_();
    q2.narrow(2, c, L - c).normal_();
    auto after = causal_linear_attention(q2, k2, v2);
    EXPECT_TRUE(torch::equal(before.narrow(2, 0, c), after.narrow(2, 0, c))) << "L " << L;
    EXPECT_FALSE(torch::equal(before.narrow(2, c, L - c), after.narrow(2, c, L - c))) << "L " << L;
  }
}

TEST(LinearAttention, CausalFormIgnoresFutureAndPadding) {
  torch::manual_seed(5);
  const int64_t L = 90;
  auto pad = padding_mask({90, 50}, L);
  auto q = torch::randn({2, 2, L, 8}), k = torch::randn({2, 2, L, 8}), v = torch::randn({2, 2, L, 8});
  for (auto norm : {LinrecNorm::kPaper, LinrecNorm::kCode}) {
    auto base = real_only(linrec_attention(q, k, v, pad, norm, LinrecForm::kCausal), pad);
    // A change at slot 70 moves nothing before it.
    auto k2 = k.clone(), v2 = v.clone();
    k2.select(2, 70).normal_();
    v2.select(2, 70).normal_();
    auto moved = real_only(linrec_attention(q, k2, v2, pad, norm, LinrecForm::kCausal), pad);
    EXPECT_TRUE(torch::equal(moved.narrow(2, 0, 70), base.narrow(2, 0, 70)));
    EXPECT_FALSE(torch::allclose(moved.narrow(2, 70, 20), base.narrow(2, 70, 20)));
    // Padded slots (row 1, first 40 slots) change no real output.
    auto k3 = k.clone(), v3 = v.clone(), q3 = q.clone();
    k3[1].narrow(1, 0, 40).normal_(0, 10);
    v3[1].narrow(1, 0, 40).normal_(0, 10);
    q3[1].narrow(1, 0, 40).normal_(0, 10);
    auto iso = real_only(linrec_attention(q3, k3, v3, pad, norm, LinrecForm::kCausal), pad);
    EXPECT_TRUE(torch::allclose(iso, base, 1e-6, 1e-6));
    // The global form's last slot is the causal form's last slot, and its padded slots change
    // no real output either.
    auto global = linrec_attention(q, k, v, pad, norm, LinrecForm::kGlobal);
    EXPECT_TRUE(torch::allclose(global.select(2, L - 1), base.select(2, L - 1), 1e-5, 1e-6));
    auto global_iso = linrec_attention(q3, k3, v3, pad, norm, LinrecForm::kGlobal);
    EXPECT_TRUE(torch::allclose(real_only(global_iso, pad), real_only(global, pad), 1e-6, 1e-6));
  }
}

TEST(LinearAttention, GradientsMatchCentralDifferences) {
  torch::manual_seed(6);
  auto pad = padding_mask({9, 4}, 9);
  for (auto norm : {LinrecNorm::kPaper, LinrecNorm::kCode}) {
    auto q = torch::randn({2, 1, 9, 3}, torch::kFloat64).requires_grad_();
    auto k = torch::randn({2, 1, 9, 3}, torch::kFloat64).requires_grad_();
    auto v = torch::randn({2, 1, 9, 3}, torch::kFloat64).requires_grad_();
    auto w = torch::randn({2, 1, 9, 3}, torch::kFloat64) * pad.logical_not().view({2, 1, 9, 1});
    for (auto form : {LinrecForm::kCausal, LinrecForm::kGlobal}) {
      auto f = [&] { return (linrec_attention(q, k, v, pad, norm, form) * w).sum(); };
      seqrec::testing::expect_gradients_match_central_differences(f, {q, k, v}, 5);
    }
  }
}

TEST(LinearAttention, BadInputIsNamed) {
  auto q = torch::randn({1, 1, 4, 2});
  auto pad = torch::zeros({1, 4}, torch::kBool);
  EXPECT_THROW(parse_linrec_norm("l1"), std::invalid_argument);
  EXPECT_THROW(parse_linrec_form("bidirectional"), std::invalid_argument);
  EXPECT_THROW(linrec_attention(q, torch::randn({1, 1, 5, 2}), q, pad, LinrecNorm::kCode, LinrecForm::kCausal),
               c10::Error);
  EXPECT_THROW(linrec_attention(q, q, q, torch::zeros({1, 5}, torch::kBool), LinrecNorm::kCode,
                                LinrecForm::kCausal),
               c10::Error);
  EXPECT_THROW(causal_linear_attention(q, q, q, 0), c10::Error);
  EXPECT_THROW(causal_linear_attention(q, q.view({1, 1, 2, 4}), q), c10::Error);
  EXPECT_THROW(causal_linear_attention(q, q, q.to(torch::kFloat64)), c10::Error);
}

}  // namespace
