#pragma once
// LISA's histogram attention on a CUDA device: the kernels' host launchers, compiled by nvcc in
// lisa_attention.cu only when SEQREC_HAVE_CUDA. Plain pointers, no Torch headers, so that nvcc
// never parses Torch; lisa_attention_fused.cpp wraps them in an autograd function, with the
// products by the values (out = A·values and its gradients) as GEMMs.
#include <cstdint>

#include "ops/lisa_attention/lisa_attention_kernel.h"

namespace seqrec::ops::cuda {

// The most codewords per codebook the kernels take; more run the ATen reference.
constexpr int64_t kLisaMaxCodewords = lisa_kernel::kMaxCodewords;

// Slots per segment for `rows` (sequence, codebook) rows of L slots on the current device (L: one
// segment); the launches then need a.seg_len set to it and a.sums to a workspace of
// lisa_kernel::workspace_elements(rows, L, W, seg_len) elements (none with one segment).
int64_t lisa_attention_segment_len(int64_t rows, int64_t L);

// Forward: a.A and a.r from a.weights, a.psi, a.pad, a.table (lisa_kernel::Args; a.g and
// a.gtable unused). Backward: a.g (the attention weights' gradient gA in, the weights' gradient
// out) and a.gtable (added to) from a.A, a.r, a.psi, a.pad, a.table. All on the current device,
// contiguous, 1 <= W <= kLisaMaxCodewords; run on `stream` (a cudaStream_t); throw
// std::runtime_error naming the CUDA error if a launch fails.
template <typename T>
void lisa_attention_forward_launch(const lisa_kernel::Args<T>& a, void* stream);
template <typename T>
void lisa_attention_backward_launch(const lisa_kernel::Args<T>& a, void* stream);

}  // namespace seqrec::ops::cuda
