#pragma once
// Exponential moving averages of assignment statistics (VQ-VAE style), shared by LISA's EMA
// codebooks and Routing's k-means centroids. Internal to models/.
#include <ATen/ATen.h>

namespace seqrec::models {

// The pending statistics are not module buffers (they are never checkpointed: a checkpoint
// is written after they were folded in), so a module's to(device) leaves them behind; the
// modules call this before touching them to keep them where the EMA buffers are.
inline void follow_device(at::Tensor& pending_count, at::Tensor& pending_sum, const at::Tensor& buffer) {
  if (pending_count.device() == buffer.device()) return;
  pending_count = pending_count.to(buffer.device());
  pending_sum = pending_sum.to(buffer.device());
}

// count [..., n] and sum [..., n, d] decay towards the pending (already all-reduced) counts
// and sums of one step; the pending tensors are cleared.
inline void ema_fold(at::Tensor& count, at::Tensor& sum, at::Tensor& pending_count, at::Tensor& pending_sum,
                     double decay) {
  follow_device(pending_count, pending_sum, count);
  count.mul_(decay).add_(pending_count, 1 - decay);
  sum.mul_(decay).add_(pending_sum, 1 - decay);
  pending_count.zero_();
  pending_sum.zero_();
}

// The mean vector of each of the n entries, its count Laplace-smoothed so that an entry no
// vector chose keeps a finite mean: count' = (count + eps) / (total + n·eps) · total.
inline at::Tensor smoothed_means(const at::Tensor& count, const at::Tensor& sum, double eps = 1e-5) {
  auto total = count.sum(-1, true);
  auto smoothed = (count + eps) / (total + count.size(-1) * eps) * total;
  return sum / smoothed.unsqueeze(-1);
}

}  // namespace seqrec::models
