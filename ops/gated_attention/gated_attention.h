#pragma once
// The attention of FLASH4Rec's gated attention layer (Yan & Li 2023, slides Eqs. 4, 5 and 7-9;
// FLASH's GAU, Hua et al. 2022): out = A·V. The model computes Z, the scale/offset transforms
// q = Q(Z), k = K(Z), the values V, the gate U and the output projection; this op is only A·V.
// The ATen reference runs on any device and differentiates through autograd w.r.t. q, k and v.
// On a CUDA device the fused kernel (gated_attention_kernel.h, gated_attention.cu) takes the
// explicit path's cases below, with no L x L tensor: the softmax form, and either form under
// active Top-K dropout with its per-row rescale (causal). On the CPU the reference runs (its
// GEMMs are faster there than the kernel's rows; docs/benchmarks.md).
//
// Per sequence b and head h (omitted), with q, k [L, s], v [L, e]:
//   visible(i, j) = slot i and slot j are real (not padded), and j <= i when causal.
//     Causal serves next-item training; bidirectional (every real slot) the cloze objective.
//     A real query always sees itself, so no real row is empty.
//   softmax form (slide Eq. 4):
//     A[i, j] = exp(q_i·k_j / sqrt(s)) / sum_{visible j'} exp(q_i·k_j' / sqrt(s))
//   cosine form (slide Eq. 5, "1 + cos", with the row-sum normaliser, since the slides give
//     none and 1 + cos >= 0 makes A a proper average; without it outputs grow with length):
//     A[i, j] = (1 + q̂_i·k̂_j) / sum_{visible j'} (1 + q̂_i·k̂_j'),  x̂ = x / max(||x||₂, 1e-12)
//     A row whose every visible key is antipodal to its query sums to 0; its normaliser is
//     clamped to 1e-12, so that row (and its output) is 0.
//   A[i, j] = 0 where not visible; rows of padded queries are 0, so their outputs are 0.
//
// Top-K attention dropout (slide Eqs. 7-9, with Eq. 9 corrected to the inverted-dropout
// rescale): in training with p > 0 and topk > 0, per (b, h) matrix A,
//   S[i, j] = j is among the topk largest visible entries of row i (all visible entries when
//             the row has fewer; invisible and padded keys are never selected; ties broken by
//             torch::topk),
//   M = 1 - S ⊙ Bernoulli(p),   A' = A ⊙ M · f,   f = sum(A) / max(sum(A ⊙ M), 1e-12),
// ONE scalar f per (b, h) matrix under bidirectional attention (the slides' definition), the
// sums over the visible entries of real rows. Under causal=true the sums run over each row
// instead (f_i, the per-row variant of the notes): one scalar for the whole matrix would let
// an output depend, through f, on the attention of later slots, i.e. on future items. A row
// (matrix) whose every visible entry would be dropped is kept whole (no f can restore it).
// Outside training, at p = 0 or topk = 0, A' = A. The Bernoulli bits are counter-based, seeded
// by one 64-bit draw from Torch's default CPU generator (as ops::dropout), so training resumes
// exactly from a saved RNG state and one manual_seed reproduces a run on any device.
//
// Paths and costs per (b, h):
//   fused (a CUDA device, fused kernels on, gated_attention_kernel_supports: the softmax form,
//     or either form under active causal Top-K dropout; float or double, s and e <= 256, L
//     within the kernel's shared-memory scratch, gated_attention_cuda.h): one warp per query row forward, per query row and then
//     per key row backward, recomputing each row's scores, O(L²·(s + e)) time, topk adds
//     O(L·topk·L / 32) per row's selection, and O(L·topk) memory beyond the inputs.
//   explicit (the same cases elsewhere, and bidirectional Top-K dropout, whose one rescale per
//     matrix needs every row at once): A is materialised, O(L²·(s + e)) time, O(L²) memory;
//     topk adds O(L²·log k).
//   linear (cosine form without active Top-K dropout), no L x L tensor: with 1 prepended to
//     q̂ and k̂ and the real-slot indicator appended to v, a single linear-attention product
//     gives the numerator sum_j v_j + q̂_i·(sum_j k̂_jᵀ v_j) and the normaliser
//     n_i + q̂_i·sum_j k̂_j together. Bidirectional: global sums, O(L·s·e). Causal: prefix sums
//     (ops::causal_linear_attention): on the CPU its fused kernel, a running [s x e] state,
//     O(L·s·e) time and no memory beyond its inputs; elsewhere its chunked reference over chunks
//     of at most 64 slots, O(L·(64·(s + e) + s·e)) time and O(L·64 + L/64·s·e) memory.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace seqrec::ops {

enum class GatedAttentionForm { kSoftmax, kCosine };
// "softmax" | "cosine"; throws std::invalid_argument naming it (as the other config parsers).
GatedAttentionForm parse_gated_attention_form(const std::string& name);
const char* gated_attention_form_name(GatedAttentionForm form);

struct GatedAttentionOptions {
  GatedAttentionForm form = GatedAttentionForm::kSoftmax;
  bool causal = true;
  int64_t topk = 0;           // Top-K dropout's k; 0 = off; >= 0
  double topk_dropout = 0.0;  // Top-K dropout's p, in [0, 1)
  bool training = false;      // Top-K dropout applies only in training
};

// q, k: [B, H, L, s] float; v: [B, H, L, e] of q's dtype; key_padding: [B, L] bool, true at
// padded slots. Returns A'·v, [B, H, L, e], 0 at padded slots. Throws c10::Error naming the
// argument on a bad shape, dtype, device, form, topk or topk_dropout. The fused kernel where it
// takes the call (gated_attention_fused_takes), else gated_attention_reference.
at::Tensor gated_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& key_padding, const GatedAttentionOptions& options);

// The ATen composition of the same op (the explicit and linear paths), differentiated by
// autograd: what the fused kernel is tested against, and what runs where it does not.
at::Tensor gated_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_padding, const GatedAttentionOptions& options);

// Whether the fused kernel computes these arguments (dtype, widths, form and Top-K cases; on a
// CUDA device the length too), on whichever device q is.
bool gated_attention_kernel_supports(const at::Tensor& q, const at::Tensor& v, const GatedAttentionOptions& options);

// Whether gated_attention runs the fused kernel: fused kernels on, q on a CUDA device, and
// gated_attention_kernel_supports.
bool gated_attention_fused_takes(const at::Tensor& q, const at::Tensor& v, const GatedAttentionOptions& options);

// The fused kernel itself (gated_attention_fused.cpp) for arguments it supports, on the CPU
// (one lane per row; for the tests) or a CUDA device; no checks.
at::Tensor gated_attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& key_padding, const GatedAttentionOptions& options);

// gated_attention over the rows of q, k [B, H, L, s] and v [B, H, L, e] in up to `groups`
// slices sorted by real length, each trimmed to the columns its longest row uses (for models
// that run a batch whole, as FLASH4Rec with its mixture of experts). Rows must be left-padded
// (real slots last); a slice then drops only slots padded in all its rows, and since padded keys
// are invisible and padded queries output 0, the result equals gated_attention's up to GEMM
// rounding, for sum over slices of rows x width^2 instead of B x L^2 (about 47% on ML-1M at
// max_len 200 with 8 slices). Under active Top-K dropout each slice draws its own seed, so the
// random bits differ from the whole-batch call's (equally distributed). A batch whose padding
// is not on the left, or with groups <= 1, runs whole.
at::Tensor gated_attention_by_length(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_padding, const GatedAttentionOptions& options,
                                     int64_t groups);

// The explicit matrix A' of the definitions above (Top-K dropout included when active, one
// generator draw then), [B, H, L, L]. The explicit path; exposed for tests and for inspection.
at::Tensor gated_attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_padding,
                                   const GatedAttentionOptions& options);

// visible(i, j) of the definitions as [B, 1, L, L] bool, for key_padding [B, L] bool.
at::Tensor gated_attention_visibility(const at::Tensor& key_padding, bool causal);

// S of the definitions for weights [B, H, L, L] and visible [B or 1, H or 1, L, L] bool:
// [B, H, L, L] bool. topk >= 1.
at::Tensor topk_positions(const at::Tensor& weights, const at::Tensor& visible, int64_t topk);

// A' = A ⊙ M · f for weights A [B, H, L, L] that are 0 outside `visible`; A itself when
// !training, p == 0 or topk == 0 (no generator draw then). per_row: f per row (causal
// attention) instead of per matrix.
// On the CPU (float, double, fused kernels on) one pass per matrix with a hand-written backward
// (topk_attention_dropout_cpu), making A' and the rows' dropped slots only; elsewhere
// topk_attention_dropout_reference. Both draw one random_seed() and hash dropout_mask's bits,
// so one generator state drops the same entries (ties in A aside: the CPU pass takes the lower
// slot first).
at::Tensor topk_attention_dropout(const at::Tensor& weights, const at::Tensor& visible, int64_t topk, double p,
                                  bool training, bool per_row = false);
// The ATen composition (topk_positions, dropout_mask, the sums), differentiated by autograd.
at::Tensor topk_attention_dropout_reference(const at::Tensor& weights, const at::Tensor& visible, int64_t topk,
                                            double p, bool training, bool per_row = false);
// The CPU pass for active dropout (training, p > 0, topk > 0) on checked arguments.
at::Tensor topk_attention_dropout_cpu(const at::Tensor& weights, const at::Tensor& visible, int64_t topk, double p,
                                      bool per_row);

}  // namespace seqrec::ops
