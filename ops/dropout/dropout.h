#pragma once
#include <cstdint>
#include <optional>
// Inverted dropout whose mask comes from a counter-based generator: one 64-bit draw from
// Torch's default generator seeds the call (so the dropout stream is part of the saved RNG
// state and resumes exactly), and element i's keep decision is a hash of (seed, i).
// On CPU this is several times cheaper than a Bernoulli draw per element; the fused CPU op
// (dropout_fused.cpp) applies the mask without making it, and its backward draws it again.
#include <ATen/core/Tensor.h>

namespace seqrec::ops {

// x * mask / (1 - p) with mask ~ Bernoulli(1 - p); identity when !training or p == 0. One
// random_seed() draw per call in training; on the CPU (float, double) the fused op, bit for bit
// dropout_reference with that seed (or the reference itself under --fused_kernels=false).
at::Tensor dropout(const at::Tensor& x, double p, bool training);

// x * dropout_mask(x, p, seed): what the fused op computes, through a mask tensor.
at::Tensor dropout_reference(const at::Tensor& x, double p, uint64_t seed);

// A feed-forward layer's activation. GELU is the exact (erf) form.
enum class Activation { kRelu, kGelu };

// dropout(act(a), p, training), with the same random_seed() draws (one per call in training
// with p > 0). On the CPU (float, double, unless --fused_kernels=false) one pass forward and one
// backward, neither making act(a) nor a mask: ReLU's values and gradients equal the reference's
// bit for bit; GELU's float Φ uses Abramowitz and Stegun's 7.1.26 for erf (absolute error
// 1.5e-7, the form ATen's vectorised GELU uses) and its double Φ std::erfc, so they match
// torch::gelu to float (double) rounding, with dropout_mask's keep bits.
at::Tensor activation_dropout(const at::Tensor& a, Activation act, double p, bool training);

// The ATen composition: dropout(torch::gelu(a) or torch::relu(a), p, training).
at::Tensor activation_dropout_reference(const at::Tensor& a, Activation act, double p, bool training);

// The epilogue of a layer whose product ran on bfloat16 operands (--matmul_precision medium):
// y [.., N], the product in bfloat16 before its bias, and bias [N] (float32) ->
// dropout(act(float(y) + bias), p, training) (no activation when act is empty), returned in
// bfloat16 when `out` is kBFloat16 (the next product's operand, rounded to nearest even as a cast
// rounds it) or float32. The same seed draws as activation_dropout and dropout. On the CPU
// (unless --fused_kernels=false) one pass forward and one backward, where the composition makes
// four forward (widen, add the bias, the activation and dropout, round) and four backward:
// values and y's gradient (bfloat16) equal the composition bit for bit with ReLU or no
// activation and to GELU's erf approximation with it; the bias's gradient (float32) is summed
// in double. ReLU's backward reads the output, so an output rounded to a bfloat16 zero passes no
// gradient (only below 2^-133). Elsewhere bias_activation_dropout_reference.
at::Tensor bias_activation_dropout(const at::Tensor& y, const at::Tensor& bias, std::optional<Activation> act,
                                   double p, bool training, at::ScalarType out);
at::Tensor bias_activation_dropout_reference(const at::Tensor& y, const at::Tensor& bias,
                                             std::optional<Activation> act, double p, bool training,
                                             at::ScalarType out);

// Softmax attention's probabilities at --matmul_precision medium: scores [B, H, Lq, L], the
// bfloat16 product q·kᵀ before scaling, and bias [B or 1, 1, Lq, L] (float32: 0 where a key is
// seen, -inf where not, every row seeing one) -> dropout(softmax(float(scores)·scale + bias),
// p, training) in bfloat16, the operand of the product with the values. The same seed draw and
// keep bits as dropout() on the float32 probabilities. On the CPU (unless --fused_kernels=false)
// one pass over each row forward and one backward (recomputing the row's softmax from the saved
// scores), where the composition makes six forward (widen, scale, bias, softmax, dropout,
// round) and five backward; exp is exp_nonpositive's (2 ulp), so values and the scores'
// gradient (bfloat16) match the composition to a bfloat16 rounding. The bias takes no gradient.
// Elsewhere softmax_dropout_bf16_reference.
at::Tensor softmax_dropout_bf16(const at::Tensor& scores, const at::Tensor& bias, double scale, double p,
                                bool training);
at::Tensor softmax_dropout_bf16_reference(const at::Tensor& scores, const at::Tensor& bias, double scale, double p,
                                          bool training);

// SplitMix64's finaliser: the counter-based hash behind dropout masks, MoE gating noise and
// keyed priorities (a bijection on 64 bits with good avalanche).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One 64-bit draw from Torch's default CPU generator: the seed of one call's counter-based
// random bits (dropout masks, Top-K attention dropout, MoE gating noise), so that they are
// part of the saved RNG state.
uint64_t random_seed();

// The scaled keep mask (values 0 or float(1/(1-p))) for `seed`, shaped like `like`: element i
// (row-major) is kept when 16-bit lane i % 4 (from the low end) of
// mix64(mix64(seed ^ φ) + (i / 4) · φ) is at least round(p · 2^16), φ = 0x9E3779B97F4A7C15.
at::Tensor dropout_mask(const at::Tensor& like, double p, uint64_t seed);

}  // namespace seqrec::ops
