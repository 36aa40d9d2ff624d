#pragma once
// LISA's codeword-histogram attention (Wu et al., WWW'21, "Linear-time self attention with
// codeword histogram"). Each item is encoded by C codebooks of W codewords; instead of
// attending over the L previous items, slot i attends over the W codewords of each codebook,
// weighted by how often (with decay) they occurred in its prefix. Cost O(L·C·W·D) time and
// O(L·C·W) memory per sequence, never O(L²).
//
// lisa_attention is what the models call. On the CPU (float, double) it runs the fused kernel of
// lisa_attention_fused.cpp: scan, normalisation and attention weights in one pass per
// (sequence, codebook) with a hand-written backward, keeping one [B, L, C, W] tensor instead of
// about ten. On a CUDA device (float, double, W <= 512) it runs lisa_attention.cu's kernels, the
// same algorithm with one warp per (sequence, codebook). Elsewhere, or with
// --fused_kernels=false, it runs lisa_attention_reference, the ATen composition that works on
// any device and differentiates through autograd. All differentiate w.r.t. weights, table and
// values (first order only).
#include <ATen/core/Tensor.h>

namespace seqrec::ops {

// Definitions, per sequence b and codebook c (b omitted):
//   F[i, c, w] = sum_{j <= i} decay^(i-j) · weights[j, c, w]              (decayed_prefix_sum)
//   A[i, c, w] = F[i, c, w]·exp(T[c, psi, w]) / sum_w' F[i, c, w']·exp(T[c, psi, w']),
//                psi = query_index[i, c]
//   out[i, :]  = sum_c sum_w A[i, c, w] · values[c, w, :]
// i.e. per codebook a softmax over w of T[c, psi, w] + log F[i, c, w], where a codeword with
// F = 0 gets weight exactly 0. A codebook whose histogram row is all zero (a slot before the
// first item under left padding) contributes exactly 0 to out[i], in the gradient as well.
//
// weights:     [B, L, C, W] float, >= 0 (soft assignments or (straight-through) one-hot rows).
//              Rows of padded slots should be zero; the op zeroes them itself from key_padding.
// query_index: [B, L, C] int64 in [0, W) everywhere (padded slots included): the hard codeword
//              of each item, usually argmax of its weights row.
// key_padding: [B, L] bool, true at padded slots. Padded slots add nothing to any histogram,
//              and their outputs are 0 (under any padding side).
// table:       [C, W, W] logits T[c, u, w] (already scaled), same dtype as weights.
// values:      [C, W, D], same dtype as weights.
// decay:       gamma in (0, 1]; 1 is the plain prefix sum.
// Returns [B, L, D]. Throws c10::Error naming the argument on a bad shape, dtype, decay or index.
at::Tensor lisa_attention(const at::Tensor& weights, const at::Tensor& query_index,
                          const at::Tensor& key_padding, const at::Tensor& table, const at::Tensor& values,
                          double decay);

// The ATen reference of the same definition (any device; equal to lisa_attention to rounding).
at::Tensor lisa_attention_reference(const at::Tensor& weights, const at::Tensor& query_index,
                                    const at::Tensor& key_padding, const at::Tensor& table,
                                    const at::Tensor& values, double decay);

// The argument checks both run (throws c10::Error naming the argument).
void check_lisa_attention_args(const at::Tensor& weights, const at::Tensor& query_index,
                               const at::Tensor& key_padding, const at::Tensor& table, const at::Tensor& values,
                               double decay);

// The decayed inclusive prefix scan alone along dim 1: weights [B, L, ...] -> F of the same
// shape (see above). Stable for any L (no decay^-j factors), exact in structure for decay = 1.
// Exposed for tests and for the online (one item at a time) state, F[i] = decay·F[i-1] + w[i].
at::Tensor decayed_prefix_sum(const at::Tensor& weights, double decay);

}  // namespace seqrec::ops
