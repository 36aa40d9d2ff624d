#pragma once
// Routed attention on a CUDA device: the kernels' host launchers, compiled by nvcc in
// routing_attention.cu only when SEQREC_HAVE_CUDA. Plain pointers, no Torch headers, so that
// nvcc never parses Torch; routing_attention_fused.cpp wraps them in an autograd function.
#include "ops/routing_attention/routing_attention_kernel.h"

namespace seqrec::ops::cuda {

// Forward: a.out and a.probs from a.r, a.v, a.window, a.valid, a.pad, a.mask. Backward: adds
// to a.gr and a.gv (zeroed by the caller) from a.grad and a.probs, with a.dl as scratch
// (routing_kernel::Args). All on the current device, contiguous; run on `stream` (a
// cudaStream_t); throw std::runtime_error naming the CUDA error if a launch fails.
template <typename T>
void routed_attention_forward_launch(const routing_kernel::Args<T>& a, void* stream);
template <typename T>
void routed_attention_backward_launch(const routing_kernel::Args<T>& a, void* stream);

}  // namespace seqrec::ops::cuda
