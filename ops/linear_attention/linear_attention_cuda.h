#pragma once
// The causal linear-attention product on a CUDA device: the kernel's host launcher, compiled by
// nvcc in linear_attention.cu only when SEQREC_HAVE_CUDA. Plain pointers, no Torch headers, so
// that nvcc never parses Torch; linear_attention_fused.cpp wraps it in an autograd function.
#include <cstdint>

namespace seqrec::ops::cuda {

// The widest key (and, for the backward, value) rows the kernel takes; wider rows run the
// ATen reference.
constexpr int64_t kLinearAttentionMaxWidth = 256;

// For each of n sequences of L slots, q and k [n, L, dk], v and out [n, L, dv], contiguous, on
// the current device:
//   forward  (reverse = false): out[t] = sum_{s <= t} (q[t] · k[s]) v[s]
//   reverse  (reverse = true):  out[t] = sum_{s >= t} (q[t] · k[s]) v[s]
// The backward of the forward product is three of these: gq = fwd(g, v, k), gk = rev(v, g, q),
// gv = rev(k, q, g). Requires 0 < dk, dv <= kLinearAttentionMaxWidth; runs on `stream` (a
// cudaStream_t); throws std::runtime_error naming the CUDA error if the launch fails.
template <typename T>
void causal_linear_attention_launch(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t L, int64_t dk,
                                    int64_t dv, bool reverse, void* stream);

}  // namespace seqrec::ops::cuda
