#include "ops/lisa_attention/lisa_attention.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace seqrec::ops {
namespace {

// Slots per chunk of the scan: one [64 x 64] decay matrix, and L/64 chunk states per level.
constexpr int64_t kChunk = 64;

// The normaliser's shift never sits more than this below a row's largest logit. It only
// matters for rows whose histogram is empty (shift = max T - 60) or has nearly vanished (a long
// decayed run of padded slots under right padding): absent codewords are computed as
// 0·exp(T - shift), and this keeps the exp finite (e^60 ~ 1e26) so no 0·inf = NaN appears,
// forward or backward.
constexpr double kMaxShiftGap = 60.0;

void check_decay(double decay) {
  TORCH_CHECK(decay > 0.0 && decay <= 1.0, "decay must be in (0, 1], got ", decay);
}

// decay^(i-j) for j <= i, else 0: [K, K]. Built in double on the host so that decay = 1 gives
// exact ones (and j > i exact zeros: no future slot reaches the past).
at::Tensor decay_matrix(int64_t K, double decay, const at::TensorOptions& opts) {
  auto idx = torch::arange(K, torch::kFloat64);
  auto diff = idx.unsqueeze(1) - idx.unsqueeze(0);
  auto m = torch::pow(decay, diff.clamp_min(0.0)).masked_fill(diff < 0, 0.0);
  return m.to(opts);
}

// Inclusive decayed scan of x [B, L, N] along dim 1. Inside a chunk one GEMM with the decay
// matrix; the state entering chunk k is the decayed scan of the chunk-end values with decay^K,
// computed by the same function one level up (L/64 rows), so no factor ever exceeds 1 (the
// cumsum(decay^-j x)·decay^i form overflows fp32 past ~870 slots at decay = e^-0.1) and the
// cost stays O(L·N·64). `decay` may be 0 here (decay^K underflows for tiny decays).
at::Tensor scan(const at::Tensor& x, double decay) {
  const int64_t B = x.size(0), L = x.size(1), N = x.size(2);
  if (L == 0 || N == 0 || B == 0) return x.clone();
  const int64_t K = std::min(kChunk, L), n = (L + K - 1) / K, Lp = n * K;
  // Zero slots appended at the end change no earlier prefix.
  auto xp = Lp == L ? x : torch::constant_pad_nd(x, {0, 0, 0, Lp - L});
  // [K, B·n·N]: every chunk of every sequence in one GEMM (rather than a broadcast batched
  // matmul that would materialise B·n copies of the decay matrix).
  auto cols = xp.reshape({B, n, K, N}).permute({2, 0, 1, 3}).reshape({K, B * n * N});
  auto local = decay_matrix(K, decay, x.options()).mm(cols).view({K, B, n, N}).permute({1, 2, 0, 3});
  if (n > 1) {
    auto ends = local.select(2, K - 1);                                  // [B, n, N]
    auto states = scan(ends, std::pow(decay, static_cast<double>(K)));  // F at each chunk's end
    // Exclusive: chunk k starts from the state after chunk k-1 (zero for the first chunk).
    auto before = torch::constant_pad_nd(states.narrow(1, 0, n - 1), {0, 0, 1, 0});
    auto pw = torch::pow(decay, torch::arange(1, K + 1, torch::kFloat64)).to(x.options()).view({K, 1});
    local = local + pw * before.unsqueeze(2);
  }
  auto out = local.reshape({B, Lp, N});
  return Lp == L ? out : out.narrow(1, 0, L);
}

}  // namespace

at::Tensor decayed_prefix_sum(const at::Tensor& weights, double decay) {
  check_decay(decay);
  TORCH_CHECK(weights.dim() >= 2, "weights must be [B, L, ...], got ", weights.sizes());
  TORCH_CHECK(at::isFloatingType(weights.scalar_type()), "weights must be floating point, got ",
              weights.scalar_type());
  const int64_t B = weights.size(0), L = weights.size(1);
  const int64_t N = L == 0 || B == 0 ? 0 : weights.numel() / (B * L);
  if (N == 0) return weights.clone();
  return scan(weights.reshape({B, L, N}), decay).reshape(weights.sizes());
}

void check_lisa_attention_args(const at::Tensor& weights, const at::Tensor& query_index,
                               const at::Tensor& key_padding, const at::Tensor& table, const at::Tensor& values,
                               double decay) {
  check_decay(decay);
  TORCH_CHECK(weights.dim() == 4 && at::isFloatingType(weights.scalar_type()),
              "weights must be float [B, L, C, W]; got ", weights.sizes(), " ", weights.scalar_type());
  const int64_t B = weights.size(0), L = weights.size(1), C = weights.size(2), W = weights.size(3);
  TORCH_CHECK(C > 0 && W > 0, "weights must have C > 0 codebooks of W > 0 codewords; got ", weights.sizes());
  TORCH_CHECK(query_index.dim() == 3 && query_index.size(0) == B && query_index.size(1) == L &&
                  query_index.size(2) == C && query_index.scalar_type() == at::kLong,
              "query_index must be int64 [B, L, C] = [", B, ", ", L, ", ", C, "]; got ", query_index.sizes(),
              " ", query_index.scalar_type());
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.size(0) == B && key_padding.size(1) == L &&
                  key_padding.scalar_type() == at::kBool,
              "key_padding must be bool [B, L] = [", B, ", ", L, "]; got ", key_padding.sizes(), " ",
              key_padding.scalar_type());
  TORCH_CHECK(table.dim() == 3 && table.size(0) == C && table.size(1) == W && table.size(2) == W &&
                  table.scalar_type() == weights.scalar_type(),
              "table must be [C, W, W] = [", C, ", ", W, ", ", W, "] of the weights' dtype ",
              weights.scalar_type(), "; got ", table.sizes(), " ", table.scalar_type());
  TORCH_CHECK(values.dim() == 3 && values.size(0) == C && values.size(1) == W &&
                  values.scalar_type() == weights.scalar_type(),
              "values must be [C, W, D] with C = ", C, ", W = ", W, " of the weights' dtype ",
              weights.scalar_type(), "; got ", values.sizes(), " ", values.scalar_type());
  if (query_index.numel() > 0) {
    const int64_t lo = query_index.min().item<int64_t>(), hi = query_index.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < W, "query_index out of range [0, W = ", W, "): min ", lo, ", max ", hi);
  }
}

at::Tensor lisa_attention_reference(const at::Tensor& weights, const at::Tensor& query_index,
                                    const at::Tensor& key_padding, const at::Tensor& table, const at::Tensor& values,
                                    double decay) {
  check_lisa_attention_args(weights, query_index, key_padding, table, values, decay);
  const int64_t B = weights.size(0), L = weights.size(1), C = weights.size(2), W = weights.size(3),
                D = values.size(2);
  if (B == 0 || L == 0) return torch::zeros({B, L, D}, values.options());

  auto pad = key_padding.view({B, L, 1, 1});
  auto hist = decayed_prefix_sum(weights.masked_fill(pad, 0.0), decay);  // F [B, L, C, W]

  // T[c, psi[b, i, c], :] as rows of the [C·W, W] table: index_select differentiates into table.
  auto row = query_index + torch::arange(C, query_index.options()).mul_(W);
  auto logits = table.reshape({C * W, W}).index_select(0, row.reshape(-1)).view({B, L, C, W});

  // A = F·exp(T - s) / sum_w F·exp(T - s) rather than softmax(T + log F): the same forward
  // with the shift s = max over present codewords of T + log F, but the gradient w.r.t. F
  // stays exp(T - s)/Z at F = 0 (a straight-through codeword not yet seen still learns),
  // where log F would give 0·inf. The shift is a constant for autograd (A does not depend
  // on it), and it is capped so that exp(T - s) stays finite for absent codewords.
  at::Tensor shift;
  {
    torch::NoGradGuard no_grad;
    auto f = hist.detach(), t = logits.detach();
    auto present = f > 0;
    auto lf = torch::log(torch::where(present, f, torch::ones_like(f)));
    auto m = (t + lf).masked_fill(present.logical_not(), -std::numeric_limits<double>::infinity());
    shift = torch::maximum(m.amax(-1, true), t.amax(-1, true) - kMaxShiftGap);
  }
  auto e = hist * torch::exp(logits - shift);
  auto z = e.sum(-1, true);  // >= 1 on any row that holds its shift's codeword
  // A row with nothing in its histogram (or a padded slot) contributes exactly 0; masking after
  // the division also stops its gradient, which 0/0 would otherwise turn into NaN.
  auto invalid = (z.detach() > 0).logical_and(pad.logical_not()).logical_not();
  auto attn = (e / z.masked_fill(invalid, 1.0)).masked_fill(invalid, 0.0);
  return attn.reshape({B * L, C * W}).mm(values.reshape({C * W, D})).view({B, L, D});
}

}  // namespace seqrec::ops
