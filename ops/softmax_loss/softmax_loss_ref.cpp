#include "ops/softmax_loss/softmax_loss.h"

#include "ops/kernels.h"
#include "ops/products.h"
#include "ops/softmax_loss/softmax_loss_rows.h"

#include <torch/torch.h>

#include <limits>

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Logits of rows [r0, r0 + n) with the padding column at -inf; `table` as product_operand gives it.
at::Tensor chunk_logits(const at::Tensor& hidden, const at::Tensor& table, int64_t r0, int64_t n) {
  auto logits = ops::matmul(hidden.narrow(0, r0, n), table.t());
  logits.select(1, 0).fill_(-std::numeric_limits<double>::infinity());
  return logits;
}

// Turns each row of `logits` [n, N + 1] into its softmax in place (exp(x - max) / sum, one exp
// per element) and returns the row maxima and sums [n, 2]: the log-normaliser is max + log(sum).
// The recomputing backward repeats exactly these steps, so both ways give the same bits.
at::Tensor softmax_rows_(at::Tensor& logits) {
  auto m = logits.amax(1, /*keepdim=*/true);
  logits.sub_(m).exp_();
  auto sum = logits.sum(1, /*keepdim=*/true);
  logits.div_(sum);
  return torch::cat({m, sum}, 1);
}

// kFused: the row passes (the softmax, its recomputation and the gradient) run
// softmax_loss_rows.h's kernels; otherwise ATen's ops, the reference. Everything else (the
// products, the chunking, what is saved) is shared, so the two differ only by the rows' roundings.
template <typename Self, bool kFused>
struct ChunkedSoftmaxLoss : public torch::autograd::Function<Self> {
  // keep: the forward stores every row's probabilities ([T, N + 1], computed in place of the
  // logits) and the backward uses them, consuming them in place; otherwise it saves only each
  // row's maximum and sum ([T, 2]) and recomputes each chunk's probabilities from its logits.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& table,
                            const at::Tensor& targets, int64_t chunk, bool keep) {
    const int64_t T = hidden.size(0);
    auto norm = torch::empty({T, 2}, hidden.options());
    auto probs = keep ? torch::empty({T, table.size(0)}, hidden.options()) : at::Tensor();
    auto total = torch::zeros({}, hidden.options().dtype(at::kDouble));
    const auto tab = product_operand(table);  // cast once for every chunk's product
    for (int64_t r0 = 0; r0 < T; r0 += chunk) {
      const int64_t n = std::min(chunk, T - r0);
      at::Tensor logits;
      if (keep) {
        logits = probs.narrow(0, r0, n);
        ops::mm_out(logits, hidden.narrow(0, r0, n), tab.t());
        logits.select(1, 0).fill_(-std::numeric_limits<double>::infinity());
      } else {
        logits = chunk_logits(hidden, tab, r0, n);
      }
      auto target_logit = logits.gather(1, targets.narrow(0, r0, n).unsqueeze(1)).squeeze(1);
      auto mn = norm.narrow(0, r0, n);
      if constexpr (kFused) {
        detail::softmax_rows_fused(logits, mn);
      } else {
        mn.copy_(softmax_rows_(logits));
      }
      auto lse = mn.select(1, 0) + mn.select(1, 1).log();
      total += (lse - target_logit).sum().to(at::kDouble);
    }
    ctx->save_for_backward({hidden, table, targets, keep ? probs : norm});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["keep"] = keep;
    return total.to(hidden.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &table = saved[1], &targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), T = hidden.size(0);
    const bool keep = ctx->saved_data["keep"].toBool();
    auto g = grads[0];  // scalar
    auto grad_hidden = torch::empty_like(hidden);
    auto grad_table = torch::zeros_like(table);
    const auto tab = product_operand(table);
    for (int64_t r0 = 0; r0 < T; r0 += chunk) {
      const int64_t n = std::min(chunk, T - r0);
      // d/dlogits = softmax - onehot(target), times the incoming gradient. The kept
      // probabilities are consumed in place (a second backward through this node then fails
      // autograd's version check rather than reading them altered).
      at::Tensor p = keep ? saved[3].narrow(0, r0, n) : chunk_logits(hidden, tab, r0, n);
      const auto mn = keep ? at::Tensor() : saved[3].narrow(0, r0, n);
      if constexpr (kFused) {
        detail::softmax_grad_rows_fused(p, mn, targets.narrow(0, r0, n), g);
      } else {
        if (!keep) p.sub_(mn.narrow(1, 0, 1)).exp_().div_(mn.narrow(1, 1, 1));
        p.scatter_add_(1, targets.narrow(0, r0, n).unsqueeze(1), -torch::ones({n, 1}, p.options()));
        p.mul_(g);
      }
      auto gh = grad_hidden.narrow(0, r0, n);
      ops::mm_out(gh, p, tab);
      ops::addmm_(grad_table, p.t(), hidden.narrow(0, r0, n));
    }
    // The fused rows wrote the kept probabilities through their data: tell autograd's version
    // check, as the reference's in-place ops do, so that a second backward fails as it does there.
    if (kFused && keep) torch::autograd::impl::bump_version(saved[3]);
    return {grad_hidden, grad_table, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct SoftmaxLossFused : ChunkedSoftmaxLoss<SoftmaxLossFused, true> {};
struct SoftmaxLossReference : ChunkedSoftmaxLoss<SoftmaxLossReference, false> {};

// Checks the arguments; returns whether the forward keeps the probabilities.
bool check_and_plan(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets, int64_t chunk_rows,
                    int64_t keep_bytes) {
  TORCH_CHECK(hidden.dim() == 2 && at::isFloatingType(hidden.scalar_type()), "hidden must be float [T, D]; got ",
              hidden.sizes(), " ", hidden.scalar_type());
  TORCH_CHECK(table.dim() == 2 && table.size(1) == hidden.size(1) && table.size(0) >= 2 &&
                  table.scalar_type() == hidden.scalar_type(),
              "table must be [N + 1, D] with D = ", hidden.size(1), ", N >= 1, of the hidden states' dtype ",
              hidden.scalar_type(), "; got ", table.sizes(), " ", table.scalar_type());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0) && targets.scalar_type() == at::kLong,
              "targets must be int64 [T] with T = ", hidden.size(0), "; got ", targets.sizes(), " ",
              targets.scalar_type());
  TORCH_CHECK(chunk_rows > 0, "chunk_rows must be > 0, got ", chunk_rows);
  TORCH_CHECK(keep_bytes >= 0, "keep_bytes must be >= 0, got ", keep_bytes);
  if (targets.numel() > 0) {
    const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
    TORCH_CHECK(lo >= 1 && hi < table.size(0), "targets out of range [1, ", table.size(0) - 1, "]: min ", lo,
                ", max ", hi);
  }
  // Keep the probabilities only for a backward that will use them, and only within budget.
  const bool grad = at::GradMode::is_enabled() && (hidden.requires_grad() || table.requires_grad());
  const double bytes = static_cast<double>(hidden.size(0)) * static_cast<double>(table.size(0)) *
                       static_cast<double>(hidden.element_size());
  return grad && bytes <= static_cast<double>(keep_bytes);
}

}  // namespace

at::Tensor softmax_loss_sum(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                            int64_t chunk_rows, int64_t keep_bytes, double label_smoothing) {
  TORCH_CHECK(label_smoothing >= 0 && label_smoothing < 1, "label_smoothing must be in [0, 1), got ", label_smoothing);
  const bool keep = check_and_plan(hidden, table, targets, chunk_rows, keep_bytes);
  // The logits take the hidden states' dtype and device (the products write them contiguous).
  const auto type = hidden.scalar_type();
  at::Tensor loss;
  if (fused_kernels() && hidden.device().is_cpu() && (type == at::kFloat || type == at::kDouble))
    loss = SoftmaxLossFused::apply(hidden, table, targets.contiguous(), chunk_rows, keep);  // rows read it raw
  else
    loss = SoftmaxLossReference::apply(hidden, table, targets, chunk_rows, keep);
  if (label_smoothing > 0) {
    const auto items = table.narrow(0, 1, table.size(0) - 1);  // the padding row takes no share
    loss = loss + label_smoothing * (hidden * (table.index_select(0, targets) - items.mean(0))).sum();
  }
  return loss;
}

at::Tensor softmax_loss_sum_reference(const at::Tensor& hidden, const at::Tensor& table, const at::Tensor& targets,
                                      int64_t chunk_rows, int64_t keep_bytes) {
  const bool keep = check_and_plan(hidden, table, targets, chunk_rows, keep_bytes);
  return SoftmaxLossReference::apply(hidden, table, targets, chunk_rows, keep);
}

}  // namespace seqrec::ops
