// Dropout fused on the CPU: y = x * keep(seed, i) / (1 - p) in one pass, with no mask tensor,
// and its backward g * keep(seed, i) / (1 - p) from the same seed. The keep decisions are
// dropout_mask's (the reference: x * dropout_mask(x, p, seed)) bit for bit: element i (in x's
// row-major order) is kept when 16-bit lane i % 4 of mix64(base + (i / 4) · φ) is at least
// p · 2^16. The hashes of a block of elements are computed first, in one loop over 64-bit lanes
// that vectorises (AVX-512 multiplies 64-bit lanes; AVX2 composes them), then the block is
// scaled in a second. The reference drew the mask (one scalar hash per 4 elements, a float
// tensor as large as x), multiplied it in, and saved it for the backward's second multiply.
// activation_dropout applies a feed-forward layer's ReLU or GELU in the same pass.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <ATen/Dispatch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <type_traits>

#include "ops/bf16_bits.h"
#include "ops/cpu_features.h"
#include "ops/dropout/dropout.h"
#include "ops/exp_nonpositive.h"
#include "ops/kernels.h"

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr int64_t kBlockWords = 256;               // hashes per block
constexpr int64_t kBlock = 4 * kBlockWords;        // elements per block

struct Keep {
  uint64_t base;       // mix64(seed ^ φ)
  uint32_t threshold;  // keep when the 16-bit lane >= threshold
};

Keep keep_of(double p, uint64_t seed) {
  return {mix64(seed ^ kGolden), static_cast<uint32_t>(p * 65536.0 + 0.5)};
}

// The 16-bit lanes of the hashes of words [w0, w0 + words): lane j of word w at h[4 (w - w0) + j].
__attribute__((always_inline)) inline void lanes(const Keep& k, int64_t w0, int64_t words, uint16_t* h) {
  alignas(64) uint64_t r[kBlockWords];
#pragma omp simd
  for (int64_t w = 0; w < words; ++w) r[w] = mix64(k.base + static_cast<uint64_t>(w0 + w) * kGolden);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  std::memcpy(h, r, static_cast<size_t>(words) * sizeof(uint64_t));
#else
  for (int64_t w = 0; w < words; ++w)
    for (int j = 0; j < 4; ++j) h[4 * w + j] = static_cast<uint16_t>(r[w] >> (16 * j));
#endif
}

// Activation and dropout in one pass (activation_dropout). Φ(x), the normal CDF, and φ(x), its
// density, share one exp: with z = |x| / √2, φ(x) = exp(-z²) / √(2π) and, in float,
// Φ(-|x|) = ½ erfc(z) = ½ t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z²), t = 1 / (1 + p z)
// (Abramowitz and Stegun 7.1.26), computed without branches so that the loop vectorises.
__attribute__((always_inline)) inline void normal_cdf_pdf(float x, float& cdf, float& pdf) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float e = exp_nonpositive(-z * z);
  const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float tail = 0.5f * poly * e;
  cdf = x >= 0.0f ? 1.0f - tail : tail;
  pdf = e * 0.39894228040143268f;
}
__attribute__((always_inline)) inline void normal_cdf_pdf(double x, double& cdf, double& pdf) {
  cdf = 0.5 * std::erfc(-x * 0.70710678118654752);
  pdf = std::exp(-0.5 * x * x) * 0.39894228040143268;
}

// What a pass computes at each element, m its keep-scale (keep ? 1 / (1 - p) : 0): the mask m
// itself (dropout_mask), x · m (dropout, and its backward on the gradient), or an activation's
// forward act(x) · m or backward (activation_dropout).
enum class Op { kMask, kScale, kRelu, kGelu };

// One pass over [begin, end) (begin a multiple of 4); k == nullptr keeps every element with
// scale 1. Backward (the activations only), given g: GELU's y = g · m · (Φ(x) + x φ(x)) from the
// input x; ReLU's from the output alone (x = the forward's y, positive exactly where the element
// was kept and the input was), so it draws no hashes.
template <typename T, Op kOp, bool kBackward>
__attribute__((always_inline)) inline void keep_range_any(const Keep* k, T scale, const T* __restrict__ x,
                                                          const T* __restrict__ g, T* __restrict__ y, int64_t begin,
                                                          int64_t end) {
  static_assert(!kBackward || kOp == Op::kRelu || kOp == Op::kGelu, "dropout's backward is its forward on the gradient");
  if constexpr (kBackward && kOp == Op::kRelu) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] > T(0) ? g[i] * scale : T(0);
    return;
  }
  alignas(64) uint16_t h[kBlock];
  if (!k) std::memset(h, 0, sizeof h);
  const uint32_t th = k ? k->threshold : 0;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    if (k) lanes(*k, b / 4, (n + 3) / 4, h);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const T m = static_cast<uint32_t>(h[i]) >= th ? scale : T(0);
      if constexpr (kOp == Op::kMask) {
        y[b + i] = m;
      } else if constexpr (kOp == Op::kScale) {
        y[b + i] = x[b + i] * m;
      } else if constexpr (kOp == Op::kRelu) {
        const T xi = x[b + i];
        y[b + i] = (xi > T(0) ? xi : T(0)) * m;
      } else {
        const T xi = x[b + i];
        T cdf, pdf;
        normal_cdf_pdf(xi, cdf, pdf);
        if constexpr (kBackward) y[b + i] = (g[b + i] * m) * (cdf + xi * pdf);
        else y[b + i] = (xi * cdf) * m;
      }
    }
  }
}

template <typename T, Op kOp, bool kBackward>
void keep_range(const Keep* k, T scale, const T* x, const T* g, T* y, int64_t begin, int64_t end) {
  keep_range_any<T, kOp, kBackward>(k, scale, x, g, y, begin, end);
}
#if SEQREC_CPU_X86
template <typename T, Op kOp, bool kBackward>
SEQREC_CPU_AVX2 void keep_range_avx2(const Keep* k, T scale, const T* x, const T* g, T* y, int64_t begin,
                                     int64_t end) {
  keep_range_any<T, kOp, kBackward>(k, scale, x, g, y, begin, end);
}
template <typename T, Op kOp, bool kBackward>
SEQREC_CPU_AVX512 void keep_range_avx512(const Keep* k, T scale, const T* x, const T* g, T* y, int64_t begin,
                                         int64_t end) {
  keep_range_any<T, kOp, kBackward>(k, scale, x, g, y, begin, end);
}
#endif

// One pass over n contiguous elements, in blocks across threads; k == nullptr: no dropout.
template <typename T, Op kOp, bool kBackward = false>
void keep_pass(const Keep* k, double p, const T* x, const T* g, T* y, int64_t n) {
  // The reference's scale is a float whatever the dtype (its mask is a float tensor).
  const T scale = k ? static_cast<T>(static_cast<float>(1.0 / (1.0 - p))) : T(1);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    const int64_t begin = b0 * kBlock, end = std::min(n, b1 * kBlock);
#if SEQREC_CPU_X86
    if (cpu_has_avx512()) return keep_range_avx512<T, kOp, kBackward>(k, scale, x, g, y, begin, end);
    if (cpu_has_avx2_fma()) return keep_range_avx2<T, kOp, kBackward>(k, scale, x, g, y, begin, end);
#endif
    keep_range<T, kOp, kBackward>(k, scale, x, g, y, begin, end);
  });
}

// x (float or double, on the CPU) times its keep mask, into a new contiguous tensor.
at::Tensor apply_keep(const at::Tensor& x_in, double p, uint64_t seed) {
  auto x = x_in.contiguous();
  auto y = torch::empty(x.sizes(), x.options());
  const Keep k = keep_of(p, seed);
  if (x.scalar_type() == at::kDouble)
    keep_pass<double, Op::kScale>(&k, p, x.data_ptr<double>(), nullptr, y.data_ptr<double>(), x.numel());
  else
    keep_pass<float, Op::kScale>(&k, p, x.data_ptr<float>(), nullptr, y.data_ptr<float>(), x.numel());
  return y;
}

class DropoutFused : public torch::autograd::Function<DropoutFused> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, double p, int64_t seed) {
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    return {apply_keep(x, p, static_cast<uint64_t>(seed))};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    return {apply_keep(grads[0], p, seed), at::Tensor(), at::Tensor()};
  }
};

// act(x) times its keep-scale (drop false: every element kept), or its backward given g, into a
// new contiguous tensor.
template <bool kBackward>
at::Tensor act_dropout_apply(Activation act, bool drop, double p, uint64_t seed, const at::Tensor& x_in,
                             const at::Tensor& g_in) {
  auto x = x_in.contiguous();
  auto g = kBackward ? g_in.contiguous() : at::Tensor();
  auto y = torch::empty(x.sizes(), x.options());
  const Keep keep = keep_of(p, seed);
  const Keep* k = drop ? &keep : nullptr;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "activation_dropout", [&] {
    using T = scalar_t;
    const T* gp = kBackward ? g.data_ptr<T>() : nullptr;
    if (act == Activation::kGelu)
      keep_pass<T, Op::kGelu, kBackward>(k, p, x.data_ptr<T>(), gp, y.data_ptr<T>(), x.numel());
    else
      keep_pass<T, Op::kRelu, kBackward>(k, p, x.data_ptr<T>(), gp, y.data_ptr<T>(), x.numel());
  });
  return y;
}

class ActivationDropoutFused : public torch::autograd::Function<ActivationDropoutFused> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, int64_t act, bool drop, double p,
                               int64_t seed) {
    const auto activation = static_cast<Activation>(act);
    auto y = act_dropout_apply<false>(activation, drop, p, static_cast<uint64_t>(seed), a, at::Tensor());
    ctx->saved_data["act"] = act;
    ctx->saved_data["drop"] = drop;
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    ctx->save_for_backward({activation == Activation::kGelu ? a : y});
    return {y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto act = static_cast<Activation>(ctx->saved_data["act"].toInt());
    const bool drop = ctx->saved_data["drop"].toBool();
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    auto ga = act_dropout_apply<true>(act, drop, p, seed, ctx->get_saved_variables()[0], grads[0]);
    return {ga, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The 16-bit lanes of elements [e0, e0 + n) (n <= kPiece), for any e0: their words' hashes drawn
// into h, and the pointer to element e0's lane (or h itself, left as it is, without k).
constexpr int64_t kPiece = kBlock - 16;
__attribute__((always_inline)) inline const uint16_t* lanes_of(const Keep* k, int64_t e0, int64_t n, uint16_t* h) {
  if (!k) return h;
  const int64_t w0 = e0 / 4, off = e0 - 4 * w0;
  lanes(*k, w0, (off + n + 3) / 4, h);
  return h + off;
}

// bias_activation_dropout: the epilogue of a product on bfloat16 operands. y's rows are N wide;
// element i = r·N + c takes bias[c] and its keep bits are lane i of the same hashes as above,
// so a row is walked in pieces of at most kPiece elements whose hashes are drawn together.

template <typename Out>
__attribute__((always_inline)) inline Out store_as(float v) {
  if constexpr (std::is_same_v<Out, uint16_t>) return to_bf16(v);
  else return v;
}
template <typename T>
__attribute__((always_inline)) inline float load_as(T v) {
  if constexpr (std::is_same_v<T, uint16_t>) return from_bf16(v);
  else return v;
}

// Rows [r0, r1) of the forward (kBackward false: out = act(y + bias)·m) or the backward (given
// g, in the output's dtype Out: gy = bf16(g·m·act'(y + bias)), gbias += the same in double;
// ReLU's from the output o alone).
template <Op kOp, bool kBackward, typename Out>
__attribute__((always_inline)) inline void epilogue_rows_any(const Keep* k, float scale, const uint16_t* __restrict__ y,
                                                             const float* __restrict__ bias, const Out* __restrict__ o,
                                                             const Out* __restrict__ g, Out* __restrict__ out,
                                                             uint16_t* __restrict__ gy, double* __restrict__ gbias,
                                                             int64_t N, int64_t r0, int64_t r1) {
  alignas(64) uint16_t h[kBlock];
  if (!k) std::memset(h, 0, sizeof h);
  const uint32_t th = k ? k->threshold : 0;
  constexpr bool kHashes = !(kBackward && kOp == Op::kRelu);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c0 = 0; c0 < N; c0 += kPiece) {
      const int64_t n = std::min(kPiece, N - c0), s = r * N + c0;
      const uint16_t* __restrict__ hp = kHashes ? lanes_of(k, s, n, h) : h;
      const float* __restrict__ b = bias + c0;
      if constexpr (!kBackward) {
        Out* __restrict__ dst = out + s;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float m = static_cast<uint32_t>(hp[j]) >= th ? scale : 0.0f;
          const float a = from_bf16(y[s + j]) + b[j];
          float v;
          if constexpr (kOp == Op::kScale) {
            v = a * m;
          } else if constexpr (kOp == Op::kRelu) {
            v = (a > 0.0f ? a : 0.0f) * m;
          } else {
            float cdf, pdf;
            normal_cdf_pdf(a, cdf, pdf);
            v = (a * cdf) * m;
          }
          dst[j] = store_as<Out>(v);
        }
      } else {
        uint16_t* __restrict__ dst = gy + s;
        double* __restrict__ gb = gbias + c0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float gj = load_as<Out>(g[s + j]);
          float v;
          if constexpr (kOp == Op::kRelu) {
            v = load_as<Out>(o[s + j]) > 0.0f ? gj * scale : 0.0f;
          } else {
            const float m = static_cast<uint32_t>(hp[j]) >= th ? scale : 0.0f;
            if constexpr (kOp == Op::kScale) {
              v = gj * m;
            } else {
              const float a = from_bf16(y[s + j]) + b[j];
              float cdf, pdf;
              normal_cdf_pdf(a, cdf, pdf);
              v = (gj * m) * (cdf + a * pdf);
            }
          }
          dst[j] = to_bf16(v);
          gb[j] += static_cast<double>(v);
        }
      }
    }
}

template <Op kOp, bool kBackward, typename Out>
void epilogue_rows(const Keep* k, float scale, const uint16_t* y, const float* bias, const Out* o, const Out* g,
                   Out* out, uint16_t* gy, double* gbias, int64_t N, int64_t r0, int64_t r1) {
  epilogue_rows_any<kOp, kBackward, Out>(k, scale, y, bias, o, g, out, gy, gbias, N, r0, r1);
}
#if SEQREC_CPU_X86
template <Op kOp, bool kBackward, typename Out>
SEQREC_CPU_AVX2 void epilogue_rows_avx2(const Keep* k, float scale, const uint16_t* y, const float* bias, const Out* o,
                                        const Out* g, Out* out, uint16_t* gy, double* gbias, int64_t N, int64_t r0,
                                        int64_t r1) {
  epilogue_rows_any<kOp, kBackward, Out>(k, scale, y, bias, o, g, out, gy, gbias, N, r0, r1);
}
template <Op kOp, bool kBackward, typename Out>
SEQREC_CPU_AVX512 void epilogue_rows_avx512(const Keep* k, float scale, const uint16_t* y, const float* bias,
                                            const Out* o, const Out* g, Out* out, uint16_t* gy, double* gbias,
                                            int64_t N, int64_t r0, int64_t r1) {
  epilogue_rows_any<kOp, kBackward, Out>(k, scale, y, bias, o, g, out, gy, gbias, N, r0, r1);
}
#endif

// All R rows of N, across threads; in the backward each thread sums the bias's gradient into its
// own row of partial sums, added up at the end.
template <Op kOp, bool kBackward, typename Out>
void epilogue_pass(const Keep* k, double p, const uint16_t* y, const float* bias, const Out* o, const Out* g, Out* out,
                   uint16_t* gy, double* partials, int64_t R, int64_t N) {
  const float scale = k ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
  at::parallel_for(0, R, std::max<int64_t>(1, kBlock / std::max<int64_t>(N, 1)), [&](int64_t r0, int64_t r1) {
    double* gb = kBackward ? partials + at::get_thread_num() * N : nullptr;
#if SEQREC_CPU_X86
    if (cpu_has_avx512())
      return epilogue_rows_avx512<kOp, kBackward, Out>(k, scale, y, bias, o, g, out, gy, gb, N, r0, r1);
    if (cpu_has_avx2_fma())
      return epilogue_rows_avx2<kOp, kBackward, Out>(k, scale, y, bias, o, g, out, gy, gb, N, r0, r1);
#endif
    epilogue_rows<kOp, kBackward, Out>(k, scale, y, bias, o, g, out, gy, gb, N, r0, r1);
  });
}

const uint16_t* bf16_data(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); }
uint16_t* bf16_data_mut(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// A float32 or bfloat16 (as its bits) tensor's data.
template <typename T>
T* data_as(const at::Tensor& t) {
  if constexpr (std::is_same_v<T, uint16_t>) return bf16_data_mut(t);
  else return t.data_ptr<float>();
}

// Calls f(std::integral_constant<Op, ...>, Out{}) for the epilogue's activation code (-1: none)
// and its result's type (uint16_t: bfloat16's bits; float).
template <typename F>
void with_op_and_out(int64_t act, bool out_bf16, F&& f) {
  auto with_out = [&](auto op) { return out_bf16 ? f(op, uint16_t{}) : f(op, float{}); };
  if (act < 0) return with_out(std::integral_constant<Op, Op::kScale>{});
  if (static_cast<Activation>(act) == Activation::kGelu) return with_out(std::integral_constant<Op, Op::kGelu>{});
  with_out(std::integral_constant<Op, Op::kRelu>{});
}

class BiasActivationDropoutFused : public torch::autograd::Function<BiasActivationDropoutFused> {
 public:
  // act: an Activation's value, or -1 for none.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& y_in, const at::Tensor& bias_in, int64_t act,
                               bool drop, double p, int64_t seed, bool out_bf16) {
    auto y = y_in.contiguous(), bias = bias_in.contiguous();
    const int64_t N = y.size(-1), R = N > 0 ? y.numel() / N : 0;
    auto out = torch::empty(y.sizes(), y.options().dtype(out_bf16 ? at::kBFloat16 : at::kFloat));
    const Keep keep = keep_of(p, static_cast<uint64_t>(seed));
    const Keep* k = drop ? &keep : nullptr;
    with_op_and_out(act, out_bf16, [&](auto op, auto out_type) {
      using Out = decltype(out_type);
      epilogue_pass<decltype(op)::value, false, Out>(k, p, bf16_data(y), bias.data_ptr<float>(), nullptr, nullptr,
                                                     data_as<Out>(out), nullptr, nullptr, R, N);
    });
    ctx->saved_data["act"] = act;
    ctx->saved_data["out_bf16"] = out_bf16;
    ctx->saved_data["drop"] = drop;
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    // The backward reads GELU's input and ReLU's output; without an activation, the mask alone.
    const bool gelu = act >= 0 && static_cast<Activation>(act) == Activation::kGelu;
    const bool relu = act >= 0 && static_cast<Activation>(act) == Activation::kRelu;
    ctx->save_for_backward({gelu ? y : at::Tensor(), bias, relu ? out : at::Tensor()});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t act = ctx->saved_data["act"].toInt();
    const bool drop = ctx->saved_data["drop"].toBool();
    const double p = ctx->saved_data["p"].toDouble();
    const Keep keep = keep_of(p, static_cast<uint64_t>(ctx->saved_data["seed"].toInt()));
    const Keep* k = drop ? &keep : nullptr;
    auto saved = ctx->get_saved_variables();
    const auto &y = saved[0], &bias = saved[1], &o = saved[2];
    const bool out_bf16 = ctx->saved_data["out_bf16"].toBool();
    auto g = grads[0].to(out_bf16 ? at::kBFloat16 : at::kFloat).contiguous();  // shaped as y
    const int64_t N = bias.size(0), R = N > 0 ? g.numel() / N : 0;
    auto gy = torch::empty(g.sizes(), g.options().dtype(at::kBFloat16));
    auto partials = torch::zeros({at::get_num_threads(), N}, bias.options().dtype(at::kDouble));
    const uint16_t* yp = y.defined() ? bf16_data(y) : nullptr;
    with_op_and_out(act, out_bf16, [&](auto op, auto out_type) {
      using Out = decltype(out_type);
      epilogue_pass<decltype(op)::value, true, Out>(k, p, yp, bias.data_ptr<float>(),
                                                    o.defined() ? data_as<Out>(o) : nullptr, data_as<Out>(g), nullptr,
                                                    bf16_data_mut(gy), partials.data_ptr<double>(), R, N);
    });
    return {gy, partials.sum(0).to(at::kFloat), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// softmax_dropout_bf16: row r of the [R, L] scores (R = B·H·Lq) takes bias row
// (b or 0)·Lq + r mod Lq, b = r / (H·Lq); its keep bits are lanes r·L + j, as dropout()'s on the
// probabilities. Each row: its keep factors into m, then x = scores·scale + bias and its max,
// then e = exp(x - max) (0 where x is -inf) and its sum, then the forward's bf16(e / sum · m)
// or, given g, the backward's bf16(p (g·m - Σ g·m·p) · scale).
template <bool kBackward>
__attribute__((always_inline)) inline void softmax_rows_any(const Keep* k, float keep_scale, float scale,
                                                            const uint16_t* __restrict__ s,
                                                            const float* __restrict__ bias, bool bias_batched,
                                                            int64_t H, int64_t Lq, int64_t L,
                                                            const uint16_t* __restrict__ g, uint16_t* __restrict__ out,
                                                            float* __restrict__ x, float* __restrict__ m, int64_t r0,
                                                            int64_t r1) {
  alignas(64) uint16_t h[kBlock];
  if (!k) std::memset(h, 0, sizeof h);
  const uint32_t th = k ? k->threshold : 0;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c0 = 0; c0 < L; c0 += kPiece) {
      const int64_t n = std::min(kPiece, L - c0);
      const uint16_t* __restrict__ hp = lanes_of(k, r * L + c0, n, h);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) m[c0 + j] = static_cast<uint32_t>(hp[j]) >= th ? keep_scale : 0.0f;
    }
    const uint16_t* __restrict__ sr = s + r * L;
    const float* __restrict__ br = bias + ((bias_batched ? r / (H * Lq) : 0) * Lq + r % Lq) * L;
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) x[j] = from_bf16(sr[j]) * scale + br[j];
    float mx = kNegInf;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < L; ++j) mx = x[j] > mx ? x[j] : mx;  // (std::max keeps it scalar)
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < L; ++j) {
      const float e = exp_nonpositive(x[j] - mx);
      x[j] = x[j] == kNegInf ? 0.0f : e;
      sum += x[j];
    }
    const float inv = 1.0f / sum;
    uint16_t* __restrict__ dst = out + r * L;
    if constexpr (!kBackward) {
#pragma omp simd
      for (int64_t j = 0; j < L; ++j) dst[j] = to_bf16((x[j] * inv) * m[j]);
    } else {
      const uint16_t* __restrict__ gr = g + r * L;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < L; ++j) dot += (from_bf16(gr[j]) * m[j]) * (x[j] * inv);
#pragma omp simd
      for (int64_t j = 0; j < L; ++j) {
        const float p = x[j] * inv;
        dst[j] = to_bf16((p * (from_bf16(gr[j]) * m[j] - dot)) * scale);
      }
    }
  }
}

template <bool kBackward>
void softmax_rows(const Keep* k, float keep_scale, float scale, const uint16_t* s, const float* bias, bool bias_batched,
                  int64_t H, int64_t Lq, int64_t L, const uint16_t* g, uint16_t* out, float* x, float* m, int64_t r0,
                  int64_t r1) {
  softmax_rows_any<kBackward>(k, keep_scale, scale, s, bias, bias_batched, H, Lq, L, g, out, x, m, r0, r1);
}
#if SEQREC_CPU_X86
template <bool kBackward>
SEQREC_CPU_AVX2 void softmax_rows_avx2(const Keep* k, float keep_scale, float scale, const uint16_t* s,
                                       const float* bias, bool bias_batched, int64_t H, int64_t Lq, int64_t L,
                                       const uint16_t* g, uint16_t* out, float* x, float* m, int64_t r0, int64_t r1) {
  softmax_rows_any<kBackward>(k, keep_scale, scale, s, bias, bias_batched, H, Lq, L, g, out, x, m, r0, r1);
}
template <bool kBackward>
SEQREC_CPU_AVX512 void softmax_rows_avx512(const Keep* k, float keep_scale, float scale, const uint16_t* s,
                                           const float* bias, bool bias_batched, int64_t H, int64_t Lq, int64_t L,
                                           const uint16_t* g, uint16_t* out, float* x, float* m, int64_t r0,
                                           int64_t r1) {
  softmax_rows_any<kBackward>(k, keep_scale, scale, s, bias, bias_batched, H, Lq, L, g, out, x, m, r0, r1);
}
#endif

// One direction over every row of scores (contiguous [B, H, Lq, L] bfloat16) into out.
template <bool kBackward>
void softmax_pass(const Keep* k, double p, double scale, const at::Tensor& scores, const at::Tensor& bias,
                  const at::Tensor& g, const at::Tensor& out) {
  const int64_t B = scores.size(0), H = scores.size(1), Lq = scores.size(2), L = scores.size(3), R = B * H * Lq;
  const float keep_scale = k ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f, sc = static_cast<float>(scale);
  const bool batched = bias.size(0) > 1;
  const uint16_t* sp = bf16_data(scores);
  const uint16_t* gp = kBackward ? bf16_data(g) : nullptr;
  uint16_t* op = bf16_data_mut(out);
  const float* bp = bias.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, kBlock / std::max<int64_t>(L, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(2 * L));
    float *x = buf.data(), *m = x + L;
#if SEQREC_CPU_X86
    if (cpu_has_avx512())
      return softmax_rows_avx512<kBackward>(k, keep_scale, sc, sp, bp, batched, H, Lq, L, gp, op, x, m, r0, r1);
    if (cpu_has_avx2_fma())
      return softmax_rows_avx2<kBackward>(k, keep_scale, sc, sp, bp, batched, H, Lq, L, gp, op, x, m, r0, r1);
#endif
    softmax_rows<kBackward>(k, keep_scale, sc, sp, bp, batched, H, Lq, L, gp, op, x, m, r0, r1);
  });
}

class SoftmaxDropoutBf16Fused : public torch::autograd::Function<SoftmaxDropoutBf16Fused> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores_in, const at::Tensor& bias_in,
                               double scale, bool drop, double p, int64_t seed) {
    auto scores = scores_in.contiguous(), bias = bias_in.contiguous();
    auto out = torch::empty(scores.sizes(), scores.options());
    const Keep keep = keep_of(p, static_cast<uint64_t>(seed));
    softmax_pass<false>(drop ? &keep : nullptr, p, scale, scores, bias, at::Tensor(), out);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["drop"] = drop;
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    ctx->save_for_backward({scores, bias});
    return {out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double p = ctx->saved_data["p"].toDouble();
    const Keep keep = keep_of(p, static_cast<uint64_t>(ctx->saved_data["seed"].toInt()));
    auto saved = ctx->get_saved_variables();
    auto g = grads[0].to(at::kBFloat16).contiguous();
    auto gs = torch::empty(saved[0].sizes(), saved[0].options());
    softmax_pass<true>(ctx->saved_data["drop"].toBool() ? &keep : nullptr, p, ctx->saved_data["scale"].toDouble(),
                       saved[0], saved[1], g, gs);
    return {gs, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor activation_dropout(const at::Tensor& a, Activation act, double p, bool training) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  if (!a.device().is_cpu() || !fused_kernels() || (a.scalar_type() != at::kFloat && a.scalar_type() != at::kDouble))
    return activation_dropout_reference(a, act, p, training);
  const bool drop = training && p > 0;
  const uint64_t seed = drop ? random_seed() : 0;  // the draw dropout() makes, no other
  return ActivationDropoutFused::apply(a, static_cast<int64_t>(act), drop, p, static_cast<int64_t>(seed))[0];
}

at::Tensor bias_activation_dropout(const at::Tensor& y, const at::Tensor& bias, std::optional<Activation> act,
                                   double p, bool training, at::ScalarType out) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 && bias.scalar_type() == at::kFloat && bias.dim() == 1 &&
                  y.dim() >= 1 && y.size(-1) == bias.size(0),
              "bias_activation_dropout takes a bfloat16 product [.., N] and a float32 bias [N]; got ",
              y.scalar_type(), " ", y.sizes(), " and ", bias.scalar_type(), " ", bias.sizes());
  TORCH_CHECK(out == at::kBFloat16 || out == at::kFloat, "bias_activation_dropout returns bfloat16 or float32, not ",
              out);
  if (!y.device().is_cpu() || !fused_kernels())
    return bias_activation_dropout_reference(y, bias, act, p, training, out);
  const bool drop = training && p > 0;
  const uint64_t seed = drop ? random_seed() : 0;  // the draw activation_dropout and dropout make
  return BiasActivationDropoutFused::apply(y, bias, act ? static_cast<int64_t>(*act) : int64_t{-1}, drop, p,
                                           static_cast<int64_t>(seed), out == at::kBFloat16)[0];
}

at::Tensor softmax_dropout_bf16(const at::Tensor& scores, const at::Tensor& bias, double scale, double p,
                                bool training) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  TORCH_CHECK(scores.dim() == 4 && scores.scalar_type() == at::kBFloat16 && bias.dim() == 4 &&
                  bias.scalar_type() == at::kFloat && (bias.size(0) == 1 || bias.size(0) == scores.size(0)) &&
                  bias.size(1) == 1 && bias.size(2) == scores.size(2) && bias.size(3) == scores.size(3),
              "softmax_dropout_bf16 takes bfloat16 scores [B, H, Lq, L] and a float32 bias [B or 1, 1, Lq, L]; got ",
              scores.scalar_type(), " ", scores.sizes(), " and ", bias.scalar_type(), " ", bias.sizes());
  TORCH_CHECK(!bias.requires_grad(), "softmax_dropout_bf16's bias takes no gradient");
  if (!scores.device().is_cpu() || !fused_kernels())
    return softmax_dropout_bf16_reference(scores, bias, scale, p, training);
  const bool drop = training && p > 0;
  const uint64_t seed = drop ? random_seed() : 0;  // the draw dropout() makes
  return SoftmaxDropoutBf16Fused::apply(scores, bias, scale, drop, p, static_cast<int64_t>(seed))[0];
}

at::Tensor dropout_mask(const at::Tensor& like, double p, uint64_t seed) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  auto mask = torch::empty(like.sizes(), like.options().dtype(at::kFloat).device(at::kCPU));
  const Keep k = keep_of(p, seed);
  keep_pass<float, Op::kMask>(&k, p, nullptr, nullptr, mask.data_ptr<float>(), mask.numel());
  return mask.to(like.options().dtype(like.scalar_type()).device(like.device()));
}

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  if (!training || p == 0) return x;
  if (!x.device().is_cpu()) return torch::dropout(x, p, true);
  const uint64_t seed = random_seed();
  if (!fused_kernels() || (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble))
    return dropout_reference(x, p, seed);
  return DropoutFused::apply(x, p, static_cast<int64_t>(seed))[0];
}

}  // namespace seqrec::ops
