#pragma once
// Softmax cross-entropy over a whole item catalogue, computed in row chunks: the [T, N] logits
// of T target slots against N items are formed [chunk, N] at a time. Two ways to the backward:
// - when the [T, N] probabilities fit in keep_bytes, the forward keeps them (written in place
//   of the logits) and the backward uses them: three [chunk, D] x [D, N]-sized products per
//   chunk in all;
// - otherwise it saves only the hidden states and each row's maximum and sum and recomputes each
//   chunk's logits: peak memory O(chunk·N + T) instead of O(T·N) (at ML-1M's 25,600 slots x
//   3,417 items, 350 MB of logits), for a fourth product per chunk. A catalogue of millions of
//   items always takes this way.
// Both give the same values and the same gradients bit for bit. On the CPU (float or double) the
// softmax and gradient passes over each chunk run fused row kernels (softmax_loss_rows.h) unless
// `--fused_kernels=false`; softmax_loss_sum_reference runs ATen's ops for them everywhere.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace seqrec::ops {

// sum_t -log softmax(hidden[t] · tableᵀ)[targets[t]], the softmax taken over columns 1..N
// (row 0 of the table is the padding item, never a class).
// hidden [T, D] float, table [N + 1, D] of the same dtype, targets [T] int64 in [1, N].
// Differentiable w.r.t. hidden and table (one backward: the kept probabilities are consumed).
// chunk_rows > 0; keep_bytes >= 0 (0: always recompute). Throws c10::Error naming the
// argument on a bad shape, dtype, chunk, budget, target or smoothing.
// label_smoothing eps in [0, 1): each slot's loss becomes (1 - eps)·(-log p_target) + eps·mean_j
// (-log p_j) over the N items (the padding item takes no share), torch's label-smoothed
// cross-entropy. That is -log p_target + eps·(z_target - mean_j z_j), the z the logits: a term
// linear in both operands, added in ATen's ops (O((T + N)·D) beside the loss's O(T·N·D)), so the
// row passes are the same with or without it.
at::Tensor softmax_loss_sum(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                            int64_t chunk_rows = 2048, int64_t keep_bytes = int64_t{256} << 20,
                            double label_smoothing = 0);

// The same loss with the row passes in ATen's ops on any device: what the fused rows are tested
// against (their values differ by exp's rounding, within 2 ulp per probability).
at::Tensor softmax_loss_sum_reference(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                                      int64_t chunk_rows = 2048, int64_t keep_bytes = int64_t{256} << 20);

// Sampled softmax with the logQ correction: each target competes with S items drawn for the
// whole batch instead of with every item:
//   sum_t -log( exp(z_t) / (exp(z_t) + sum_{j : sample[j] != targets[t]} exp(z_tj - log_expected[sample[j]])) ),
//   z_t = hidden[t] · table[targets[t]], z_tj = hidden[t] · table[sample[j]],
// where log_expected[i] = log(S · q(i)) for the distribution q the sample was drawn from (with
// replacement). Each draw then adds exp(z)/(S q) of its item, so the sum is an unbiased estimate
// of the full softmax's normaliser less the target's own term: a draw equal to the row's target
// (an "accidental hit") is left out of that row, and the target's logit is not corrected. With
// all N items drawn once and log_expected 0 it is the full softmax. Memory O(T·S), not O(T·N).
// hidden [T, D] float, table [N + 1, D], targets [T] in [1, N], sample [S] in [1, N] (repeats
// allowed), log_expected [N + 1] float (undefined: no correction).
// Differentiable w.r.t. hidden and table; throws c10::Error naming a bad shape or id.
at::Tensor sampled_softmax_loss_sum(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                                    const at::Tensor& sample, const at::Tensor& log_expected);

}  // namespace seqrec::ops
