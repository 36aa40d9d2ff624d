#pragma once
// LightSANs' causal interest attention on a CUDA device: the kernels' host launchers, compiled
// by nvcc in interest_attention.cu only when SEQREC_HAVE_CUDA. Plain pointers, no Torch headers,
// so that nvcc never parses Torch; interest_attention_fused.cpp wraps them in an autograd function.
#include "ops/interest_attention/interest_attention_kernel.h"

namespace seqrec::ops::cuda {

// Forward: a.out, a.m, a.z, a.s and (when a.ckpt is set) a.ckpt from a.q, a.k, a.v, a.a, a.pad,
// a.mask, with a.state as scratch. Backward: a.gq, a.gk, a.gv and a.ga from a.grad and what the
// forward kept, with a.state, a.agg, a.carry, a.carry_c and a.dp as scratch
// (interest_kernel::Args). All on the current device, contiguous; run on `stream` (a
// cudaStream_t); throw std::runtime_error naming the CUDA error if a launch fails.
template <typename T>
void interest_attention_forward_launch(const interest_kernel::Args<T>& a, void* stream);
template <typename T>
void interest_attention_backward_launch(const interest_kernel::Args<T>& a, void* stream);

}  // namespace seqrec::ops::cuda
