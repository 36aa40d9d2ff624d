#pragma once
// The causal linear-attention product on a CUDA device: the kernel's host launcher, compiled by
// nvcc in linear_attention.cu only when SEQREC_HAVE_CUDA. Plain pointers, no Torch headers, so
// that nvcc never parses Torch; linear_attention_fused.cpp wraps it in an autograd function.
#include <cstdint>

#include "ops/linear_attention/linear_attention_kernel.h"

namespace seqrec::ops::cuda {

// The widest key (and, for the backward, value) rows the kernel takes; wider rows run the
// ATen reference.
constexpr int64_t kLinearAttentionMaxWidth = linear_kernel::kMaxWidth;

// For each of n sequences of L slots, q and k [n, L, dk], v and out [n, L, dv], contiguous, on
// the current device:
//   forward  (reverse = false): out[t] = sum_{s <= t} (q[t] · k[s]) v[s]
//   reverse  (reverse = true):  out[t] = sum_{s >= t} (q[t] · k[s]) v[s]
// The backward of the forward product is three of these: gq = fwd(g, v, k), gk = rev(v, g, q),
// gv = rev(k, q, g). Requires 0 < dk, dv <= kLinearAttentionMaxWidth; runs on `stream` (a
// cudaStream_t); throws std::runtime_error naming the CUDA error if the launch fails.
// The backward of out = fwd(q, k, v) given the output's gradient g, as three products over
// the operands {q, k, v, g} (indices 0-3), in the order dq, dk, dv:
//   dq[t] = sum_{s <= t} (g[t] · v[s]) k[s]  = fwd(g, v, k)
//   dk[s] = sum_{t >= s} (v[s] · g[t]) q[t]  = rev(v, g, q)
//   dv[s] = sum_{t >= s} (k[s] · q[t]) g[t]  = rev(k, q, g)
struct ProductCall {
  int a, b, c;  // the product's q, k, v
  bool reverse;
};
constexpr ProductCall kBackwardProducts[3] = {{3, 2, 1, false}, {2, 3, 0, true}, {1, 0, 3, true}};

// seg_len: slots per segment (causal_linear_attention_segment_len's; <= 0 or >= L: one); with
// more than one segment, sums points to linear_kernel::workspace_elements(n, L, dk, dv, seg_len)
// elements of scratch on the device, which the call overwrites.
template <typename T>
void causal_linear_attention_launch(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t L, int64_t dk,
                                    int64_t dv, bool reverse, int64_t seg_len, T* sums, void* stream);

// The segment length for n sequences of L slots and dv value columns on the current device
// (linear_kernel::plan_segment_len with its multiprocessor count).
int64_t causal_linear_attention_segment_len(int64_t n, int64_t L, int64_t dv);

}  // namespace seqrec::ops::cuda
