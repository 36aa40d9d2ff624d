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
// The ATen reference (the two functions below) runs on any device and differentiates through
// autograd; causal_interest_attention computes their composition without materialising
// [B, L, k, D] (interest_attention_fused.cpp) and is what LightSANs runs.
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

// The two above fused: interest_attention(q, causal_interest_aggregation(k, logits_k, pad),
// causal_interest_aggregation(v, logits_v, pad), dropout, training) -> [B, H, L, Dh], equal to it
// to rounding (and, given the same generator state, with the same dropout mask: one draw from
// Torch's default generator per call). q [B, H, L, Dh]; k, v [B, L, H·Dh]; logits_k, logits_v
// [B, L, k]; key_padding [B, L] bool. A scan slot by slot per (sequence, head) that never forms
// the per-slot interests (interest_attention_kernel.h: a warp per row on a CUDA device;
// interest_groups_cpu.h: a vector's width of rows at a time on the CPU): work O(k·Dh) per slot and head; memory O(L·k) per row for the running
// maxima, normalisers and scores the backward reads, plus the running sums entering every
// `chunk` slots (0 = about sqrt(L)) from which the backward recomputes one chunk at a time:
// O((L/chunk + chunk)·k·Dh). CPU and CUDA float/double (elsewhere, or with --fused_kernels=false,
// the reference composition). Outputs at padded slots are finite (zeros before a row's first real
// slot, no NaN in the gradients); an earlier slot never reads a later one, so changing slot t
// leaves every slot before t bit-identical.
at::Tensor causal_interest_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& logits_k, const at::Tensor& logits_v,
                                     const at::Tensor& key_padding, double dropout, bool training,
                                     int64_t chunk = 0);

}  // namespace seqrec::ops
