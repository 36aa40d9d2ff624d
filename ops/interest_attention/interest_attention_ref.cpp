#include "ops/interest_attention/interest_attention.h"

#include "ops/dropout/dropout.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace seqrec::ops {

at::Tensor causal_interest_aggregation(const at::Tensor& x, const at::Tensor& logits,
                                       const at::Tensor& key_padding, int64_t chunk) {
  TORCH_CHECK(x.dim() == 3, "x must be [B, L, D], got ", x.sizes());
  TORCH_CHECK(logits.dim() == 3 && logits.size(0) == x.size(0) && logits.size(1) == x.size(1),
              "logits must be [B, L, k] matching x ", x.sizes(), "; got ", logits.sizes());
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.scalar_type() == at::kBool &&
                  key_padding.size(0) == x.size(0) && key_padding.size(1) == x.size(1),
              "key_padding must be bool [B, L] matching x ", x.sizes(), "; got ", key_padding.sizes());
  TORCH_CHECK(chunk >= 0, "chunk must be >= 0 (0 = automatic), got ", chunk);
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), K = logits.size(2);
  if (L == 0) return torch::zeros({B, 0, K, D}, x.options());
  if (chunk == 0) chunk = std::max<int64_t>(8, int64_t{1} << std::lround(std::log2(std::sqrt(double(L)))));
  const int64_t C = std::min(chunk, L), n = (L + C - 1) / C, Lp = n * C;
  const double inf = std::numeric_limits<double>::infinity();

  // Appended slots are padding: they change no earlier slot.
  auto real = key_padding.logical_not();
  at::Tensor xs = x, a = logits;
  if (Lp != L) {
    xs = torch::constant_pad_nd(x, {0, 0, 0, Lp - L});
    a = torch::constant_pad_nd(logits, {0, 0, 0, Lp - L});
    real = torch::constant_pad_nd(real.to(at::kByte), {0, Lp - L}).to(at::kBool);
  }
  auto xc = xs.reshape({B, n, C, D});
  auto ac = a.reshape({B, n, C, K});
  auto rc = real.reshape({B, n, C, 1});

  // Stabilisers (constants for autograd: the ratio below does not depend on them).
  at::Tensor m_chunk, m_slot, m_before, chunk_real;
  {
    torch::NoGradGuard no_grad;
    auto am = ac.detach().masked_fill(rc.logical_not(), -inf);
    m_chunk = std::get<0>(am.max(2));                         // [B, n, K] largest logit per chunk
    auto running = std::get<0>(am.cummax(2));                  // [B, n, C, K] inside the chunk
    auto shifted = torch::constant_pad_nd(m_chunk, {0, 0, 1, 0}, -inf).narrow(1, 0, n);
    m_before = std::get<0>(shifted.cummax(1));                 // [B, n, K] over earlier chunks
    m_slot = torch::maximum(running, m_before.unsqueeze(2));   // [B, n, C, K] what slot t can see
    // Slots that see no real row: any finite value (all their weights are zero anyway).
    m_slot.masked_fill_(m_slot.isinf(), 0.0);
    chunk_real = m_chunk.isinf().logical_not();               // [B, n, K] chunk has a real row
    m_chunk = m_chunk.masked_fill(chunk_real.logical_not(), 0.0);
  }

  // Inside each chunk: w[t, k, s] = exp(a[s, k] - M[t, k]) for real s <= t, laid out
  // [B*n, T*K, S] so the weighted sums are one batched GEMM with no transposed copies.
  auto visible = torch::ones({C, C}, x.options().dtype(at::kBool)).tril().view({1, 1, C, 1, C}) &
                 rc.reshape({B, n, 1, 1, C});
  auto expo = ac.transpose(2, 3).unsqueeze(2) - m_slot.unsqueeze(-1);  // [B, n, T, K, S]
  auto w = torch::where(visible, expo, torch::full({}, -inf, expo.options())).exp();
  auto z = w.sum(-1);                                                    // [B, n, T, K]
  auto num = torch::bmm(w.reshape({B * n, C * K, C}), xc.reshape({B * n, C, D})).view({B, n, C, K, D});

  if (n > 1) {
    // Whole earlier chunks, each summarised against its own maximum, rescaled to M[t].
    auto e = torch::where(rc, ac - m_chunk.unsqueeze(2), torch::full({}, -inf, ac.options())).exp();  // [B, n', S, K]
    auto zc = e.sum(2);                                                                            // [B, n', K]
    auto nc = torch::bmm(e.reshape({B * n, C, K}).transpose(1, 2), xc.reshape({B * n, C, D}))          // [B*n', K, D]
                  .view({B, n, K, D}).permute({0, 2, 1, 3});                                      // [B, K, n', D]
    at::Tensor u;  // [B, K, n, T, n'], constants
    {
      torch::NoGradGuard no_grad;
      auto earlier = torch::ones({n, n}, x.options().dtype(at::kBool)).tril(-1);  // [c, c'] c' < c
      auto use = earlier.view({1, 1, n, 1, n}) & chunk_real.permute({0, 2, 1}).reshape({B, K, 1, 1, n});
      auto ex = m_chunk.permute({0, 2, 1}).reshape({B, K, 1, 1, n}) - m_slot.permute({0, 3, 1, 2}).unsqueeze(-1);
      u = torch::where(use, ex, torch::full({}, -inf, ex.options())).exp();
    }
    z = z + (u * zc.permute({0, 2, 1}).reshape({B, K, 1, 1, n})).sum(-1).permute({0, 2, 3, 1});
    num = num + torch::matmul(u.view({B, K, n * C, n}), nc).view({B, K, n, C, D}).permute({0, 2, 3, 1, 4});
  }
  // z >= 1 wherever the slot sees a real row (its largest visible logit has weight 1).
  auto out = num / z.clamp_min(1e-30).unsqueeze(-1);
  out = out.reshape({B, Lp, K, D});
  return Lp == L ? out : out.narrow(1, 0, L);
}

at::Tensor interest_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                              double dropout, bool training) {
  TORCH_CHECK(q.dim() == 4, "q must be [B, H, L, Dh], got ", q.sizes());
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  TORCH_CHECK(keys.dim() == 4 && keys.size(0) == B && keys.size(1) == L && keys.size(3) == H * Dh,
              "keys must be [B, L, k, H*Dh] = [", B, ", ", L, ", k, ", H * Dh, "]; got ", keys.sizes());
  TORCH_CHECK(values.sizes() == keys.sizes(), "values must match keys ", keys.sizes(), "; got ",
              values.sizes());
  const int64_t K = keys.size(2);
  // [B, L, k, H, Dh] -> [B, H, L, k, Dh]
  auto kh = keys.reshape({B, L, K, H, Dh}).permute({0, 3, 1, 2, 4});
  auto vh = values.reshape({B, L, K, H, Dh}).permute({0, 3, 1, 2, 4});
  auto scores = torch::matmul(kh, q.unsqueeze(-1)).squeeze(-1) / std::sqrt(static_cast<double>(Dh));
  auto p = ops::dropout(torch::softmax(scores, -1), dropout, training);  // [B, H, L, k]
  return torch::matmul(p.unsqueeze(-2), vh).squeeze(-2);               // [B, H, L, Dh]
}

}  // namespace seqrec::ops
