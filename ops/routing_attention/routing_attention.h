#pragma once
// Routing attention (Roy et al., TACL 2021, "Efficient content-based sparse attention with
// routing transformers"), made exactly causal for next-item training, and the windowed local
// attention its local heads use. The ATen implementations run on any device and differentiate
// through autograd (w.r.t. the routing vectors and values; routing decisions are discrete and
// centroids are updated by EMA outside the op). routed_attention runs a fused kernel on CPU
// float/double (routing_attention_fused.cpp), a CUDA kernel on a CUDA device
// (routing_attention.cu), and routed_attention_reference elsewhere or with --fused_kernels=false.
//
// Routing (shared queries and keys, as the paper does for causal models). Per sequence b and
// routing head h (omitted below), r[i] is the routing vector of slot i (the caller's
// LayerNormed shared query/key) and mu[c] the c-th of K centroids:
//   cluster(i) = argmax_c <r[i], mu[c]>            (the query's cluster; lowest c on ties)
//   chunks: slots are grouped into chunks of S consecutive slots aligned to the RIGHT edge
//     (the last slot ends a chunk), so start(i) = max(0, L - S·(floor((L-1-i)/S) + 1)).
//   window(i) = the W real (non-padded) slots j < start(i) with the largest <r[j], mu[c]>,
//     c = cluster(i): each cluster takes its top-W tokens of the prefix before the chunk
//     (balanced routing); fewer when fewer real slots precede the chunk.
//   out[i] = sum_{j in window(i) ∪ {i}} softmax_j(scale·<r[i], r[j]>) · v[j]
// Every key of window(i) precedes i's chunk, so no output depends on a later slot, membership
// included (the paper's top-W over the whole sequence lets later tokens push earlier ones out
// of a window; that leak does not exist here). Chunks count from the right edge, so extra
// left padding changes no real slot's output. Padded slots get output 0.
// Cost per sequence and head: O(L·K·d) to score slots against centroids, O(G·K·(W+S)) to
// select windows incrementally chunk by chunk (G = ceil(L/S) chunks), O(L·W·d) to attend:
// O(L^1.5·d) at K = W = S = sqrt(L).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace seqrec::ops {

struct RoutingPlan {
  at::Tensor cluster;  // [B, H, L] int64: cluster(i)
  at::Tensor window;   // [B, H, L, W] int64: the key slots of window(i); 0 where !valid
  at::Tensor valid;    // [B, H, L, W] bool: slot holds a key
};

// r: [B, H, L, d] float; centroids: [H, K, d] same dtype; key_padding: [B, L] bool, true at
// padded slots; window W >= 1; chunk S >= 1. No autograd (indices only). Throws c10::Error
// naming the argument on a bad shape, dtype or size.
RoutingPlan causal_balanced_routing(const at::Tensor& r, const at::Tensor& centroids,
                                    const at::Tensor& key_padding, int64_t window, int64_t chunk);

// The attention of the routing heads given a plan: r [B, H, L, d] (queries and keys), v
// [B, H, L, dv] -> [B, H, L, dv] (0 at padded slots). `dropout` applies to the attention
// probabilities [B, H, L, W + 1] (window keys, then the query's own key) when `training`
// (ops::dropout). Differentiable w.r.t. r and v. On CPU float/double a fused autograd Function
// (memory O(L·W) per sequence and head instead of O(L·W·d); no double backward) that equals
// routed_attention_reference to rounding and, under one generator state, drops the same
// probabilities (one ops::random_seed draw, the same mask); the same on a CUDA device (float,
// double) through CUDA kernels; elsewhere the reference.
at::Tensor routed_attention(const at::Tensor& r, const at::Tensor& v, const RoutingPlan& plan,
                            const at::Tensor& key_padding, double scale, double dropout, bool training);

// The ATen implementation of routed_attention (row gathers, elementwise products, autograd),
// on any device: what the tests compare the fused kernel with.
at::Tensor routed_attention_reference(const at::Tensor& r, const at::Tensor& v, const RoutingPlan& plan,
                                      const at::Tensor& key_padding, double scale, double dropout,
                                      bool training);

namespace detail {
// The argument checks both routed_attention implementations run, so that they reject the same
// inputs with the same messages: shapes, dtypes, devices, plan.window in [0, L), dropout in
// [0, 1). Throws c10::Error naming the argument.
void check_routed_attention_args(const at::Tensor& r, const at::Tensor& v, const RoutingPlan& plan,
                                 const at::Tensor& key_padding, double dropout);
}  // namespace detail

// Local heads: causal softmax attention over the last `window` slots (keys j with
// i - window < j <= i, real slots only); q, k, v [B, H, L, d] -> [B, H, L, d] (0 at padded
// slots), scores scaled by 1/sqrt(d). O(L·window·d) time and memory.
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& key_padding, int64_t window, double dropout, bool training);

}  // namespace seqrec::ops
