#pragma once
// Softmax cross-entropy over a whole item catalogue, computed in row chunks: the [T, N] logits
// of T target slots against N items never exist at once (forward or backward), only
// [chunk, N] of them; the backward recomputes each chunk's logits from the saved hidden
// states and per-row log-normalisers. Peak memory O(chunk·N + T) instead of O(T·N) (at
// ML-1M's 25,600 slots x 3,417 items, 350 MB of logits and as much again for their gradient),
// for one extra [chunk, D] x [D, N] product per chunk.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace seqrec::ops {

// sum_t -log softmax(hidden[t] · tableᵀ)[targets[t]], the softmax taken over columns 1..N
// (row 0 of the table is the padding item, never a class).
// hidden [T, D] float, table [N + 1, D] of the same dtype, targets [T] int64 in [1, N].
// Differentiable w.r.t. hidden and table. chunk_rows > 0. Throws c10::Error naming the
// argument on a bad shape, dtype, chunk or target.
at::Tensor softmax_loss_sum(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                            int64_t chunk_rows = 2048);

}  // namespace seqrec::ops
