#include <torch/torch.h>

#include <limits>

#include "ops/products.h"
#include "ops/softmax_loss/softmax_loss.h"

namespace seqrec::ops {

at::Tensor sampled_softmax_loss_sum(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                                    const at::Tensor& sample, const at::Tensor& log_expected) {
  TORCH_CHECK(hidden.dim() == 2 && table.dim() == 2 && hidden.size(1) == table.size(1),
              "sampled_softmax_loss_sum: hidden [T, D] and table [N + 1, D] expected, got ", hidden.sizes(), " and ",
              table.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0) && targets.scalar_type() == at::kLong,
              "sampled_softmax_loss_sum: targets must be int64 [T] with T = ", hidden.size(0), ", got ",
              targets.sizes());
  TORCH_CHECK(sample.dim() == 1 && sample.size(0) > 0 && sample.scalar_type() == at::kLong,
              "sampled_softmax_loss_sum: sample must be a non-empty int64 [S], got ", sample.sizes());
  const int64_t N = table.size(0) - 1;
  for (const auto* ids : {&targets, &sample})
    if (ids->numel() > 0)
      TORCH_CHECK(ids->min().item<int64_t>() >= 1 && ids->max().item<int64_t>() <= N,
                  "sampled_softmax_loss_sum: ", ids == &targets ? "targets" : "sample", " must be item ids in [1, ", N,
                  "]");
  TORCH_CHECK(!log_expected.defined() || (log_expected.dim() == 1 && log_expected.size(0) == N + 1),
              "sampled_softmax_loss_sum: log_expected must be [N + 1] = [", N + 1, "], got ",
              log_expected.defined() ? log_expected.sizes() : at::IntArrayRef{});
  auto target_logit = (hidden * table.index_select(0, targets)).sum(-1);            // [T]
  auto sample_logit = ops::matmul(hidden, table.index_select(0, sample).t());         // [T, S]
  if (log_expected.defined())
    sample_logit = sample_logit - log_expected.to(sample_logit.scalar_type()).index_select(0, sample).unsqueeze(0);
  const auto hit = targets.unsqueeze(1).eq(sample.unsqueeze(0));                      // [T, S]
  sample_logit = sample_logit.masked_fill(hit, -std::numeric_limits<double>::infinity());
  auto logits = torch::cat({target_logit.unsqueeze(1), sample_logit.to(target_logit.scalar_type())}, 1);
  return (torch::logsumexp(logits, 1) - target_logit).sum();
}

}  // namespace seqrec::ops
