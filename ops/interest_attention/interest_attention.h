#pragma once
// LightSANs' item-to-interest attention (Fan et al., SIGIR'21), causal. Each slot's keys and
// values are aggregated into k latent interests, interest j being a softmax-weighted
// (over positions) average of the rows; the query then attends over its k interests: O(L·k)
// scores instead of O(L²).
//
// The paper's aggregation runs over the whole sequence (and the released code normalises the
// attention over the query axis), which leaks future items into earlier slots; it was trained
// on one prefix per sample with a last-position loss. Here interest j at slot t aggregates only
// the real rows s <= t:
//     agg[t, j] = sum_{s <= t, real} softmax_{s <= t}(logits[:, j])[s] · x[s]
// so every slot is a valid next-item state (SASRec-style every-position training), and the
// last slot of a sequence equals the paper's aggregation of that whole sequence.
//
// The ATen reference runs on any device and differentiates through autograd; a fused kernel
// (which need not materialise [B, L, k, D]) will sit behind the same signatures.
#include <ATen/core/Tensor.h>

namespace seqrec::ops {

// x [B, L, D], logits [B, L, k], key_padding [B, L] bool -> [B, L, k, D]. Exact and stable for
// any logit range: computed in chunks with running maxima (a slot's weights are normalised
// against the largest logit it can see). A slot that sees no real row gets zeros. Work per
// slot is O(k·D·(chunk + L/chunk)); chunk 0 picks the power of two nearest sqrt(L).
at::Tensor causal_interest_aggregation(const at::Tensor& x, const at::Tensor& logits,
                                       const at::Tensor& key_padding, int64_t chunk = 0);

// q [B, H, L, Dh]; keys, values [B, L, k, H·Dh] (from causal_interest_aggregation) ->
// [B, H, L, Dh]: slot t's query attends its own k interests, softmax over the k interests,
// scores scaled by 1/sqrt(Dh); `dropout` on the attention probabilities when training.
at::Tensor interest_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                              double dropout, bool training);

}  // namespace seqrec::ops
