#pragma once
// Causal multi-head softmax attention (SASRec's), one host entry point. The ATen
// reference runs on any device and differentiates through autograd; a fused CUDA kernel
// will sit behind this same signature.
#include <ATen/core/Tensor.h>

namespace seqrec::ops {

// q, k, v: [B, H, L, Dh]; key_padding: [B, L] bool, true where the slot is padding.
// Query i attends keys j <= i that are not padding. A query with no visible key (a padded
// slot before the first item under left padding) attends only itself, so no row is empty;
// callers zero padded outputs. Scores are scaled by 1/sqrt(Dh). `dropout` applies to the
// attention probabilities when `training`.
at::Tensor causal_softmax_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& key_padding, double dropout, bool training);

// The additive mask the op uses: [B, 1, L, L] with 0 where attention is allowed and -inf
// elsewhere. Exposed for tests and for callers that reuse one mask across layers.
at::Tensor causal_padding_bias(const at::Tensor& key_padding, at::ScalarType dtype);

// The bidirectional mask (BERT4Rec-style cloze training): every real key, and the query's
// own slot, visible to every query; [B, 1, L, L].
at::Tensor padding_bias(const at::Tensor& key_padding, at::ScalarType dtype);

// Same as above with a precomputed bias from causal_padding_bias (or padding_bias, which
// makes the attention bidirectional). q and k may also be [1, H, L, Dh] with v [B, H, L, Dh]:
// scores shared by the batch (positions-only attention), computed once and told apart by the
// bias alone; the same result as q and k expanded to the batch, at one L x L product for B.
// At --matmul_precision medium (ops/products.h) the scores
// and probabilities stay bfloat16: ops::softmax_dropout_bf16 (ops/dropout/dropout.h) turns the
// one into the other in a pass per row.
at::Tensor causal_softmax_attention_biased(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& bias,
                                           double dropout, bool training);

}  // namespace seqrec::ops
