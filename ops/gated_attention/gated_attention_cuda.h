#pragma once
// FLASH4Rec's fused gated attention on a CUDA device: the kernels' host launchers, compiled by
// nvcc in gated_attention.cu only when SEQREC_HAVE_CUDA. Plain pointers, no Torch headers, so
// that nvcc never parses Torch; gated_attention_fused.cpp wraps them in an autograd function.
#include "ops/gated_attention/gated_attention_kernel.h"

namespace seqrec::ops::cuda {

// Forward: a.out, a.stats and a.dropped from a.q, a.k, a.v, a.pad (a.qn, a.kn in the cosine
// form). Backward: a.gq, a.gk, a.gv from a.grad and what the forward kept, the query pass then
// the key pass (gated_kernel::Args). Each warp's 2·L scratch values are shared memory, so L
// must satisfy gated_attention_cuda_fits. All on the current device, contiguous; run on
// `stream` (a cudaStream_t); throw std::runtime_error naming the CUDA error if a launch fails.
template <typename T>
void gated_attention_forward_launch(const gated_kernel::Args<T>& a, void* stream);
template <typename T>
void gated_attention_backward_launch(const gated_kernel::Args<T>& a, void* stream);

// Whether a block's scratch (kRowWarps warps of 2·L values of `element_bytes`) fits the 48 KiB
// of shared memory every device gives a block without opting in.
inline bool gated_attention_cuda_fits(int64_t L, int64_t element_bytes) {
  return static_cast<int64_t>(kRowWarps) * 2 * L * element_bytes <= 48 * 1024;
}

}  // namespace seqrec::ops::cuda
