// LightSANs' causal item-to-interest aggregation and interest attention against loop-level
// references in double: lengths that break the chunking, left padding, all-padding rows,
// logits spread over hundreds (stability), causality, padding isolation, gradients against
// central differences; the fused causal_interest_attention (the slot-by-slot scan of
// interest_attention_kernel.h) against their composition (outputs, gradients, dropout mask,
// checkpoint intervals that break the length, causality, padding), and the scan's CUDA kernel:
// emulated lane by lane here, on a device in the GPU tier.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include "ops/dropout/dropout.h"
#include "ops/interest_attention/interest_attention.h"
#include "ops/interest_attention/interest_attention_kernel.h"
#include "tests/ops/op_test_util.h"

namespace {
using seqrec::testing::max_err;

using seqrec::testing::padding_mask;

using namespace seqrec::ops;

at::Tensor naive_aggregation(const at::Tensor& x, const at::Tensor& a, const at::Tensor& pad) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), K = a.size(2);
  auto xd = x.to(torch::kFloat64).contiguous(), ad = a.to(torch::kFloat64).contiguous();
  auto X = xd.accessor<double, 3>(), A = ad.accessor<double, 3>();
  auto P = pad.accessor<bool, 2>();
  auto out = torch::zeros({B, L, K, D}, torch::kFloat64);
  auto O = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t j = 0; j < K; ++j) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= t; ++s)
          if (!P[b][s]) mx = std::max(mx, A[b][s][j]);
        if (std::isinf(mx)) continue;  // sees no real row: zeros
        double z = 0;
        for (int64_t s = 0; s <= t; ++s)
          if (!P[b][s]) z += std::exp(A[b][s][j] - mx);
        for (int64_t s = 0; s <= t; ++s)
          if (!P[b][s])
            for (int64_t d = 0; d < D; ++d) O[b][t][j][d] += std::exp(A[b][s][j] - mx) / z * X[b][s][d];
      }
  return out;
}

TEST(InterestAggregation, MatchesLoopReference) {
  torch::manual_seed(11);
  struct Case { int64_t B, L, D, K; std::vector<int64_t> lengths; double spread; };
  std::vector<Case> cases = {{1, 1, 3, 1, {1}, 1},          {2, 7, 5, 3, {7, 2}, 1},
                             {3, 67, 4, 5, {67, 33, 0}, 3}, {2, 130, 6, 2, {130, 97}, 1},
                             {2, 64, 3, 4, {64, 64}, 200},  {2, 100, 3, 3, {100, 70}, 400}};
  for (auto& c : cases)
    for (int64_t chunk : {int64_t{32}, int64_t{5}}) {
      auto x = torch::randn({c.B, c.L, c.D});
      auto a = torch::randn({c.B, c.L, c.K}) * c.spread;
      auto pad = padding_mask(c.lengths, c.L);
      auto got = causal_interest_aggregation(x, a, pad, chunk);
      ASSERT_TRUE(torch::isfinite(got).all().item<bool>()) << "L=" << c.L;
      auto want = naive_aggregation(x, a, pad);
      EXPECT_TRUE(torch::allclose(got.to(torch::kFloat64), want, 1e-4, 1e-5))
          << "L=" << c.L << " chunk=" << chunk << " spread=" << c.spread << " max err "
          << (got.to(torch::kFloat64) - want).abs().max().item<double>();
    }
}

TEST(InterestAggregation, CausalAndPaddingIsolated) {
  torch::manual_seed(12);
  const int64_t L = 75;
  auto pad = padding_mask({75, 30}, L);
  auto x = torch::randn({2, L, 4}), a = torch::randn({2, L, 3});
  auto base = causal_interest_aggregation(x, a, pad);
  auto x2 = x.clone(), a2 = a.clone();
  x2.select(1, 60).normal_();
  a2.select(1, 60).fill_(50.0);
  auto moved = causal_interest_aggregation(x2, a2, pad);
  EXPECT_TRUE(torch::equal(moved.narrow(1, 0, 60), base.narrow(1, 0, 60)));
  EXPECT_FALSE(torch::allclose(moved.narrow(1, 60, 15), base.narrow(1, 60, 15)));
  auto x3 = x.clone(), a3 = a.clone();
  x3[1].narrow(0, 0, 45).normal_(0, 10);
  a3[1].narrow(0, 0, 45).fill_(1e4);
  auto iso = causal_interest_aggregation(x3, a3, pad);
  auto real = pad.logical_not().view({2, L, 1, 1});
  EXPECT_TRUE(torch::allclose(iso * real, base * real, 1e-6, 1e-6));
  // Padded slots before the first item see nothing and give zeros, not NaN.
  EXPECT_TRUE(torch::equal(iso[1].narrow(0, 0, 45), torch::zeros({45, 3, 4})));
}

TEST(InterestAttention, MatchesLoopReference) {
  torch::manual_seed(13);
  const int64_t B = 2, H = 2, L = 5, Dh = 3, K = 4;
  auto q = torch::randn({B, H, L, Dh}, torch::kFloat64);
  auto keys = torch::randn({B, L, K, H * Dh}, torch::kFloat64);
  auto values = torch::randn({B, L, K, H * Dh}, torch::kFloat64);
  auto got = interest_attention(q, keys, values, 0.0, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < L; ++t) {
        std::vector<double> s(K);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < K; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < Dh; ++d)
            s[j] += q[b][h][t][d].item<double>() * keys[b][t][j][h * Dh + d].item<double>();
          s[j] /= std::sqrt(double(Dh));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < K; ++j) z += std::exp(s[j] - mx);
        for (int64_t d = 0; d < Dh; ++d) {
          double o = 0;
          for (int64_t j = 0; j < K; ++j) o += std::exp(s[j] - mx) / z * values[b][t][j][h * Dh + d].item<double>();
          EXPECT_NEAR(got[b][h][t][d].item<double>(), o, 1e-10);
        }
      }
}

TEST(InterestAggregation, GradientsMatchCentralDifferences) {
  torch::manual_seed(14);
  auto pad = padding_mask({11, 6}, 11);
  auto x = torch::randn({2, 11, 3}, torch::kFloat64).requires_grad_();
  auto a = (torch::randn({2, 11, 2}, torch::kFloat64) * 3).requires_grad_();
  auto w = torch::randn({2, 11, 2, 3}, torch::kFloat64);
  auto f = [&] { return (causal_interest_aggregation(x, a, pad, 4) * w).sum(); };
  seqrec::testing::expect_gradients_match_central_differences(f, {x, a});
}

// ---- causal_interest_attention (fused) against the reference composition ----

struct Inputs {
  at::Tensor q, k, v, ak, av, pad;
  std::vector<at::Tensor> all() const { return {q, k, v, ak, av}; }
};

Inputs make_inputs(int64_t B, int64_t H, int64_t L, int64_t Dh, int64_t K, const std::vector<int64_t>& lengths,
                   double spread, torch::Dtype dtype = torch::kFloat32, bool grad = false) {
  auto o = torch::TensorOptions().dtype(dtype);
  Inputs in{torch::randn({B, H, L, Dh}, o), torch::randn({B, L, H * Dh}, o), torch::randn({B, L, H * Dh}, o),
            torch::randn({B, L, K}, o) * spread, torch::randn({B, L, K}, o) * spread, padding_mask(lengths, L)};
  if (grad)
    for (auto* t : {&in.q, &in.k, &in.v, &in.ak, &in.av}) t->requires_grad_();
  return in;
}

at::Tensor reference(const Inputs& in, double p = 0.0, bool training = false) {
  return interest_attention(in.q, causal_interest_aggregation(in.k, in.ak, in.pad),
                            causal_interest_aggregation(in.v, in.av, in.pad), p, training);
}

// The op as LightSANs calls it (the scan of interest_attention_kernel.h on the CPU).
at::Tensor op(const Inputs& in, int64_t chunk = 0, double p = 0.0, bool training = false) {
  return causal_interest_attention(in.q, in.k, in.v, in.ak, in.av, in.pad, p, training, chunk);
}


TEST(CausalInterestAttention, MatchesReferenceComposition) {
  torch::manual_seed(21);
  struct Case { int64_t B, H, L, Dh, K; std::vector<int64_t> lengths; double spread; };
  std::vector<Case> cases = {{1, 1, 1, 3, 1, {1}, 1},          {2, 2, 7, 2, 3, {7, 2}, 1},
                             {3, 1, 67, 4, 5, {67, 33, 0}, 3}, {2, 2, 130, 3, 1, {130, 97}, 1},
                             {2, 1, 67, 4, 5, {67, 40}, 400},  {2, 2, 130, 2, 5, {0, 100}, 200}};
  for (auto& c : cases) {
    auto in = make_inputs(c.B, c.H, c.L, c.Dh, c.K, c.lengths, c.spread);
    auto want = reference(in);
    for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{32}, int64_t{200}}) {
      if (chunk == 1 && c.L > 70) continue;  // slow; L = 67 covers it
      auto got = op(in, chunk);
      ASSERT_EQ(got.sizes(), want.sizes());
      ASSERT_TRUE(torch::isfinite(got).all().item<bool>()) << "L=" << c.L << " chunk=" << chunk;
      EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-5))
          << "L=" << c.L << " H=" << c.H << " K=" << c.K << " chunk=" << chunk << " spread=" << c.spread
          << " max err " << max_err(got, want);
    }
  }
}

TEST(CausalInterestAttention, ZerosBeforeFirstItemAndNoGradPathIdentical) {
  torch::manual_seed(22);
  auto in = make_inputs(3, 2, 20, 3, 4, {20, 6, 0}, 5, torch::kFloat32, true);
  auto out = op(in, 8);
  out.backward(torch::randn_like(out));
  for (auto& t : in.all()) EXPECT_TRUE(torch::isfinite(t.grad()).all().item<bool>());
  EXPECT_TRUE(torch::equal(out[1].narrow(1, 0, 14).detach(), torch::zeros({2, 14, 3})));
  EXPECT_TRUE(torch::equal(out[2].detach(), torch::zeros({2, 20, 3})));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(op(in, 8), out.detach()));
}

TEST(CausalInterestAttention, GradientsMatchReferenceComposition) {
  torch::manual_seed(23);
  struct Case { int64_t B, H, L, Dh, K; std::vector<int64_t> lengths; double spread; int64_t chunk; };
  std::vector<Case> cases = {{1, 1, 1, 2, 1, {1}, 1, 0},         {2, 2, 7, 2, 3, {7, 3}, 1, 5},
                             {3, 1, 67, 3, 5, {67, 30, 0}, 3, 0}, {2, 2, 67, 2, 5, {50, 67}, 400, 5},
                             {2, 1, 13, 3, 1, {13, 1}, 2, 1},     {2, 2, 30, 2, 2, {30, 0}, 1, 64},
                             {2, 1, 130, 2, 3, {130, 77}, 5, 32}};
  for (auto& c : cases) {
    auto in = make_inputs(c.B, c.H, c.L, c.Dh, c.K, c.lengths, c.spread, torch::kFloat64, true);
    auto w = torch::randn({c.B, c.H, c.L, c.Dh}, torch::kFloat64);
    auto want = torch::autograd::grad({(reference(in) * w).sum()}, in.all());
    auto got = torch::autograd::grad({(op(in, c.chunk) * w).sum()}, in.all());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].defined() && torch::isfinite(got[i]).all().item<bool>()) << "L=" << c.L << " input " << i;
      const double scale = want[i].abs().max().item<double>();
      EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-8, 1e-8 * scale))
          << "L=" << c.L << " chunk=" << c.chunk << " input " << i << " max err " << max_err(got[i], want[i])
          << " (scale " << scale << ")";
    }
  }
}

TEST(CausalInterestAttention, GradientsMatchCentralDifferences) {
  torch::manual_seed(24);
  auto in = make_inputs(2, 2, 9, 2, 3, {9, 5}, 2, torch::kFloat64, true);
  auto w = torch::randn({2, 2, 9, 2}, torch::kFloat64);
  auto f = [&] { return (op(in, 4) * w).sum(); };
  seqrec::testing::expect_gradients_match_central_differences(f, in.all(), 2);
}

TEST(CausalInterestAttention, DropoutMaskIsReproducibleAndUsedInBackward) {
  torch::manual_seed(25);
  auto in = make_inputs(2, 2, 23, 2, 4, {23, 12}, 2, torch::kFloat64, true);
  auto w = torch::randn({2, 2, 23, 2}, torch::kFloat64);
  const double p = 0.3;
  torch::manual_seed(7);
  auto a = op(in, 5, p, true);
  torch::manual_seed(7);
  auto a2 = op(in, 5, p, true);
  torch::manual_seed(7);
  auto b = op(in, 8, p, true);  // the mask does not depend on the chunking
  auto c = op(in, 5, p, true);  // the generator moved on: another mask
  EXPECT_TRUE(torch::equal(a, a2));
  EXPECT_TRUE(torch::allclose(a, b, 1e-12, 1e-12));
  EXPECT_FALSE(torch::allclose(a, c));
  EXPECT_FALSE(torch::allclose(a, op(in, 5)));
  // Given the same generator state the mask is the reference's; forward and gradients agree.
  torch::manual_seed(7);
  auto r = reference(in, p, true);
  EXPECT_TRUE(torch::allclose(a, r, 1e-10, 1e-12)) << max_err(a, r);
  auto want = torch::autograd::grad({(r * w).sum()}, in.all());
  auto got = torch::autograd::grad({(a * w).sum()}, in.all());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-8, 1e-12)) << "input " << i << " " << max_err(got[i], want[i]);
  // Central differences with the generator reset before each evaluation.
  auto f = [&] {
    torch::manual_seed(9);
    return (op(in, 5, p, true) * w).sum();
  };
  seqrec::testing::expect_gradients_match_central_differences(f, {in.q, in.ak, in.v}, 5);
  // Evaluation mode: no dropout, no generator draw.
  EXPECT_TRUE(torch::allclose(op(in, 5, p, false), op(in, 5), 0, 0));
}

TEST(CausalInterestAttention, CausalBitExactAndPaddingIsolated) {
  torch::manual_seed(26);
  const int64_t L = 75;
  auto in = make_inputs(2, 2, L, 3, 4, {75, 30}, 3);
  for (int64_t chunk : {int64_t{0}, int64_t{16}, int64_t{7}}) {
    auto base = op(in, chunk);
    auto moved = in;
    moved.q = in.q.clone(), moved.k = in.k.clone(), moved.v = in.v.clone();
    moved.ak = in.ak.clone(), moved.av = in.av.clone();
    moved.q.select(2, 60).normal_();
    moved.k.select(1, 60).normal_();
    moved.v.select(1, 60).normal_(0, 5);
    moved.ak.select(1, 60).fill_(50.0);
    moved.av.select(1, 60).fill_(-50.0);
    auto out = op(moved, chunk);
    EXPECT_TRUE(torch::equal(out.narrow(2, 0, 60), base.narrow(2, 0, 60))) << "chunk " << chunk;
    EXPECT_FALSE(torch::allclose(out.narrow(2, 60, 15), base.narrow(2, 60, 15))) << "chunk " << chunk;

    // Padded rows (before row 1's first item) change nothing at real slots, whatever they hold.
    auto iso = in;
    iso.k = in.k.clone(), iso.v = in.v.clone(), iso.ak = in.ak.clone(), iso.av = in.av.clone();
    iso.k[1].narrow(0, 0, 45).normal_(0, 10);
    iso.v[1].narrow(0, 0, 45).normal_(0, 10);
    iso.ak[1].narrow(0, 0, 45).fill_(1e4);
    iso.av[1].narrow(0, 0, 45).fill_(-1e4);
    auto got = op(iso, chunk);
    ASSERT_TRUE(torch::isfinite(got).all().item<bool>());
    auto real = in.pad.logical_not().view({2, 1, L, 1});
    EXPECT_TRUE(torch::allclose(got * real, base * real, 1e-6, 1e-6)) << "chunk " << chunk;
  }
}

// ---- the scan of interest_attention_kernel.h on the kernel's shapes: the CPU's rows, the
// ---- CUDA kernel emulated, and the CUDA kernel itself ----

// A shape for the scan's checks; `chunk` is its checkpoint interval (0: the op's choice).
struct ScanCase {
  int64_t B, H, L, Dh, K;
  std::vector<int64_t> lengths;
  bool left;  // padding before the real slots (else after: slots after the last real one)
  double spread;
  int64_t chunk;
};

// Shapes that break the kernel's lanes and chunks: Dh 1, 3, 32, 33 and 40 (lanes holding no, one
// and two dims), chunks of 1, 4, 7, 16 and L, left and right padding, all-padding rows, a single
// slot, logits spread over hundreds, and LightSANs' k of 20.
std::vector<ScanCase> scan_cases() {
  return {{1, 1, 1, 3, 1, {1}, true, 1, 4},           {2, 2, 7, 1, 3, {7, 2}, true, 1, 4},
          {3, 1, 37, 33, 5, {37, 20, 0}, true, 3, 16}, {2, 2, 29, 3, 4, {29, 11}, false, 2, 1},
          {2, 1, 40, 40, 2, {40, 9}, false, 400, 40},  {2, 3, 21, 4, 6, {0, 21}, true, 200, 4},
          {2, 2, 50, 32, 20, {50, 13}, true, 2, 7},
          // More rows than one of the CPU's groups (8 float rows under AVX2, 4 at the baseline):
          // several groups, the last part-filled.
          {5, 2, 23, 5, 3, {23, 1, 0, 17, 9}, true, 3, 4},
          {9, 1, 12, 2, 2, {12, 12, 3, 7, 0, 1, 12, 5, 8}, false, 2, 5}};
}

std::string describe(const ScanCase& c, torch::Dtype dtype, double p) {
  std::ostringstream s;
  s << "B=" << c.B << " H=" << c.H << " L=" << c.L << " Dh=" << c.Dh << " K=" << c.K << " chunk=" << c.chunk
    << (c.left ? " left" : " right") << " spread " << c.spread << (dtype == torch::kFloat64 ? " double" : " float")
    << " dropout " << p;
  return s.str();
}

// The scan's output and five gradients against the reference's (or the CPU's). Float: the scan
// sums slot by slot (and across lanes), the reference in chunks and batched products; relative
// to each tensor's largest value both are within a few hundred ulp.
void expect_scan_close(const at::Tensor& out, const std::vector<at::Tensor>& grads, const at::Tensor& want,
                       const std::vector<at::Tensor>& g_want, torch::Dtype dtype, const std::string& where) {
  const double tol = dtype == torch::kFloat64 ? 1e-9 : 2e-4;
  auto close = [&](const at::Tensor& x_in, const at::Tensor& y) {
    auto x = x_in.detach().cpu();
    return torch::isfinite(x).all().item<bool>() && max_err(x, y) <= tol * std::max(1.0, y.abs().max().item<double>());
  };
  EXPECT_TRUE(close(out, want.detach())) << where << " out, max err " << max_err(out.detach().cpu(), want);
  const char* names[] = {"q", "k", "v", "logits_k", "logits_v"};
  for (size_t i = 0; i < 5; ++i)
    EXPECT_TRUE(close(grads[i], g_want[i]))
        << where << " grad " << names[i] << ", max err " << max_err(grads[i].cpu(), g_want[i]);
}

// The CUDA kernels' row functions (interest_attention_kernel.h) on the CPU with an emulated warp:
// out and the gradients of q, k, v and both logits for the output gradient g, given the dropout
// keep mask (or none) and the kernel's chunk C. Outputs, gradients and the kept rows start as
// NaN, so anything the kernels leave unwritten shows.
template <typename T>
std::vector<at::Tensor> emulated_interest(const Inputs& in, const at::Tensor& mask_in, const at::Tensor& g_in,
                                          int64_t C) {
  namespace ik = seqrec::ops::cuda::interest_kernel;
  const int64_t B = in.q.size(0), H = in.q.size(1), L = in.q.size(2), Dh = in.q.size(3), K = in.ak.size(2);
  const int64_t D = H * Dh, BH = B * H, chunks = (L + C - 1) / C;
  auto o = in.q.options().requires_grad(false);
  auto q = in.q.detach().contiguous(), k = in.k.detach().contiguous(), v = in.v.detach().contiguous();
  auto a = torch::cat({in.ak.detach(), in.av.detach()}, 2).contiguous();
  auto pad = in.pad.contiguous();
  auto mask = mask_in.defined() ? mask_in.contiguous() : at::Tensor();
  auto g = g_in.contiguous();
  auto nan = [&](std::vector<int64_t> size) -> at::Tensor { return torch::full(size, std::nan(""), o); };
  const at::Tensor out = nan({B, H, L, Dh}), m = nan({BH, L, 2 * K}), z = nan({BH, L, 2 * K}),
                   s = nan({BH, L, K}), ckpt = nan({BH, chunks, 2 * K, Dh}), state = nan({BH, 2 * K, Dh}),
                   gq = nan({B, H, L, Dh}), gk = nan({B, L, D}), gv = nan({B, L, D}), ga = nan({BH, L, 2 * K}),
                   agg = nan({BH, C, 2 * K, Dh}), carry = nan({BH, 2 * K, Dh}), carry_c = nan({BH, 2, 2 * K}),
                   slot = nan({BH, 7 * K});
  ik::Args<T> args{};
  args.q = q.data_ptr<T>();
  args.k = k.data_ptr<T>();
  args.v = v.data_ptr<T>();
  args.a = a.data_ptr<T>();
  args.pad = pad.data_ptr<bool>();
  args.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
  args.out = out.data_ptr<T>();
  args.m = m.data_ptr<T>();
  args.z = z.data_ptr<T>();
  args.s = s.data_ptr<T>();
  args.ckpt = ckpt.data_ptr<T>();
  args.state = state.data_ptr<T>();
  args.grad = g.data_ptr<T>();
  args.gq = gq.data_ptr<T>();
  args.gk = gk.data_ptr<T>();
  args.gv = gv.data_ptr<T>();
  args.ga = ga.data_ptr<T>();
  args.agg = agg.data_ptr<T>();
  args.carry = carry.data_ptr<T>();
  args.carry_c = carry_c.data_ptr<T>();
  args.slot = slot.data_ptr<T>();
  args.B = B, args.H = H, args.L = L, args.Dh = Dh, args.K = K, args.C = C;
  args.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dh)));
  ik::emulate(args, /*backward=*/false);
  EXPECT_FALSE(torch::isnan(out).any().item<bool>() || torch::isnan(s).any().item<bool>() ||
               torch::isnan(ckpt).any().item<bool>())
      << "a forward output left unwritten";
  ik::emulate(args, /*backward=*/true);
  // The logits' gradient: the heads' shares summed (what the host does on the device).
  auto ga_sum = ga.view({B, H, L, 2 * K}).sum(1);
  return {out, gq, gk, gv, ga_sum.narrow(2, 0, K), ga_sum.narrow(2, K, K)};
}

// Against the reference composition, in double and float, over scan_cases(), with and without
// dropout (the mask the reference draws from the same generator state). The 32-lane emulation
// checks the CUDA kernel's row functions, which the CPU (the other tests) no longer runs;
// what it cannot show (the device's shuffles, syncs, launch errors) is
// CudaKernelMatchesCpuKernel's, on a GPU.
TEST(CausalInterestAttention, CudaKernelLogicMatchesReference) {
  torch::manual_seed(27);
  for (const auto& c : scan_cases())
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (double p : {0.0, 0.3}) {
        auto in = make_inputs(c.B, c.H, c.L, c.Dh, c.K, c.lengths, c.spread, dtype, true);
        in.pad = padding_mask(c.lengths, c.L, c.left);
        auto g = torch::randn({c.B, c.H, c.L, c.Dh}, dtype);
        at::Tensor mask;
        torch::manual_seed(7);
        if (p > 0) {
          mask = dropout_mask(torch::empty({c.B, c.H, c.L, c.K}, dtype), p, random_seed());
          torch::manual_seed(7);  // the reference draws the same seed
        }
        auto want = reference(in, p, p > 0);
        auto g_want = torch::autograd::grad({want}, in.all(), {g});
        auto got = dtype == torch::kFloat64 ? emulated_interest<double>(in, mask, g, c.chunk)
                                            : emulated_interest<float>(in, mask, g, c.chunk);
        expect_scan_close(got[0], {got.begin() + 1, got.end()}, want, g_want, dtype, describe(c, dtype, p));
      }
}

// The op on the CPU (rows in groups, interest_groups_cpu.h, behind the mask draw a GPU shares)
// against the reference composition over the kernel's shapes: values, the five gradients,
// dropout under one generator state with as many generator draws as the reference makes, and the
// no-grad path (no checkpoints kept).
TEST(CausalInterestAttention, ScanMatchesReferenceOnKernelShapes) {
  torch::manual_seed(30);
  for (auto c : scan_cases())
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (double p : {0.0, 0.3}) {
        if (c.chunk == 4) c.chunk = 0;  // the op's own choice too
        auto in = make_inputs(c.B, c.H, c.L, c.Dh, c.K, c.lengths, c.spread, dtype, true);
        in.pad = padding_mask(c.lengths, c.L, c.left);
        auto g = torch::randn({c.B, c.H, c.L, c.Dh}, dtype);
        torch::manual_seed(7);
        auto want = reference(in, p, p > 0);
        auto want_next = torch::rand({2});
        auto g_want = torch::autograd::grad({want}, in.all(), {g});
        torch::manual_seed(7);
        auto got = op(in, c.chunk, p, p > 0);
        auto got_next = torch::rand({2});
        auto g_got = torch::autograd::grad({got}, in.all(), {g});
        const std::string where = describe(c, dtype, p);
        EXPECT_NE(got.grad_fn()->name().find("CausalInterestScan"), std::string::npos) << where;
        EXPECT_TRUE(torch::equal(got_next, want_next)) << where << ": another number of generator draws";
        expect_scan_close(got, g_got, want, g_want, dtype, where);
        torch::NoGradGuard no_grad;
        torch::manual_seed(7);
        EXPECT_TRUE(torch::equal(op(in, c.chunk, p, p > 0), got.detach())) << where << " no-grad path";
      }
}

// The CPU walks rows in groups, each row in its own lane: a sequence's output and gradients are
// bit-identical whether it runs alone (a narrow group) or in a batch (wide groups), at any place
// in its group.
TEST(CausalInterestAttention, CpuRowsIndependentOfTheirGroup) {
  torch::manual_seed(31);
  const int64_t B = 11, H = 2, L = 19, Dh = 6, K = 3;
  auto in = make_inputs(B, H, L, Dh, K, {19, 4, 0, 19, 11, 1, 19, 7, 13, 19, 2}, 3, torch::kFloat32, true);
  auto g = torch::randn({B, H, L, Dh});
  auto out = op(in, 5);
  auto grads = torch::autograd::grad({out}, in.all(), {g});
  for (int64_t b : {int64_t{0}, int64_t{3}, int64_t{4}, int64_t{10}}) {
    Inputs one;
    one.q = in.q.narrow(0, b, 1).detach().requires_grad_();
    one.k = in.k.narrow(0, b, 1).detach().requires_grad_();
    one.v = in.v.narrow(0, b, 1).detach().requires_grad_();
    one.ak = in.ak.narrow(0, b, 1).detach().requires_grad_();
    one.av = in.av.narrow(0, b, 1).detach().requires_grad_();
    one.pad = in.pad.narrow(0, b, 1);
    auto alone = op(one, 5);
    EXPECT_TRUE(torch::equal(alone.detach(), out.narrow(0, b, 1).detach())) << "sequence " << b;
    auto alone_grads = torch::autograd::grad({alone}, one.all(), {g.narrow(0, b, 1)});
    for (size_t i = 0; i < alone_grads.size(); ++i)
      EXPECT_TRUE(torch::equal(alone_grads[i], grads[i].narrow(0, b, 1))) << "sequence " << b << " gradient " << i;
  }
}

// The CUDA kernels (what causal_interest_attention runs on a CUDA device) against the CPU's
// groups on the same inputs: values and every gradient, float and double, the emulation's
// shapes plus LightSANs' ML-1M shape (B 64, L 200, d 64 in 2 heads, k 20) and a long row
// (L 1,000), and dropout under one generator state (the same mask on both devices). The no-grad
// path (no checkpoints kept) gives the same output. GPU machines only.
TEST(CausalInterestAttention, CudaKernelMatchesCpuKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  torch::manual_seed(28);
  auto cases = scan_cases();
  cases.push_back({2, 2, 1000, 32, 20, {1000, 517}, true, 3, 0});
  std::vector<int64_t> ml1m(64);
  for (int64_t b = 0; b < 64; ++b) ml1m[b] = b % 8 == 0 ? 3 : 200 - 3 * b;
  cases.push_back({64, 2, 200, 32, 20, ml1m, true, 2, 0});
  for (const auto& c : cases)
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (double p : {0.0, 0.3}) {
        auto in = make_inputs(c.B, c.H, c.L, c.Dh, c.K, c.lengths, c.spread, dtype);
        in.pad = padding_mask(c.lengths, c.L, c.left);
        auto g = torch::randn({c.B, c.H, c.L, c.Dh}, dtype);
        auto run_on = [&](const torch::Device& device) {
          std::vector<at::Tensor> x;
          for (const auto& t : in.all()) x.push_back(t.to(device).requires_grad_());
          torch::manual_seed(7);
          auto out = causal_interest_attention(x[0], x[1], x[2], x[3], x[4], in.pad.to(device), p, p > 0, c.chunk);
          auto grads = torch::autograd::grad({out}, x, {g.to(device)});
          torch::NoGradGuard no_grad;
          torch::manual_seed(7);
          auto plain = causal_interest_attention(x[0], x[1], x[2], x[3], x[4], in.pad.to(device), p, p > 0, c.chunk);
          return std::make_tuple(out, grads, plain);
        };
        auto [want, g_want, plain_want] = run_on(torch::kCPU);
        auto [got, g_got, plain_got] = run_on(torch::kCUDA);
        const std::string where = describe(c, dtype, p);
        ASSERT_TRUE(got.is_cuda()) << where;
        EXPECT_NE(got.grad_fn()->name().find("CausalInterestScan"), std::string::npos)
            << where << ": " << got.grad_fn()->name();
        // As in the emulation (the device's shuffles sum as the emulated butterfly does).
        expect_scan_close(got, g_got, want, g_want, dtype, where);
        EXPECT_TRUE(torch::equal(plain_got.cpu(), got.detach().cpu())) << where << " no-grad path";
        EXPECT_TRUE(torch::allclose(plain_want, want.detach())) << where << " CPU no-grad path";
      }
}

TEST(CausalInterestAttention, BadInputIsNamed) {
  auto in = make_inputs(1, 2, 4, 3, 2, {4}, 1);
  EXPECT_THROW(causal_interest_attention(in.q, in.k.narrow(2, 0, 5), in.v, in.ak, in.av, in.pad, 0, false), c10::Error);
  EXPECT_THROW(causal_interest_attention(in.q, in.k, in.v, in.ak, in.av.narrow(2, 0, 1), in.pad, 0, false), c10::Error);
  EXPECT_THROW(causal_interest_attention(in.q, in.k, in.v, in.ak, in.av, in.pad.to(torch::kFloat), 0, false),
               c10::Error);
  EXPECT_THROW(causal_interest_attention(in.q, in.k, in.v, in.ak, in.av, in.pad, 0, false, -1), c10::Error);
  EXPECT_THROW(causal_interest_attention(in.q, in.k, in.v, in.ak, in.av, in.pad, 1.0, true), c10::Error);
}

TEST(InterestAggregation, BadInputIsNamed) {
  auto x = torch::randn({1, 4, 2});
  EXPECT_THROW(causal_interest_aggregation(x, torch::randn({1, 5, 2}), torch::zeros({1, 4}, torch::kBool)),
               c10::Error);
  EXPECT_THROW(causal_interest_aggregation(x, torch::randn({1, 4, 2}), torch::zeros({1, 4}, torch::kBool), -1),
               c10::Error);
  EXPECT_THROW(interest_attention(torch::randn({1, 2, 4, 3}), torch::randn({1, 4, 2, 5}),
                                  torch::randn({1, 4, 2, 5}), 0.0, false),
               c10::Error);
}

}  // namespace
