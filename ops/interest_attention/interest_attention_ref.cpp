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
  TORCH_CHECK(chunk > 0, "chunk must be > 0, got ", chunk);
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), K = logits.size(2);
  if (L == 0) return torch::zeros({B, 0, K, D}, x.options());
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

  // Inside each chunk: w[t, s] = exp(a[s] - M[t]) for real s <= t.
  auto visible = torch::ones({C, C}, x.options().dtype(at::kBool)).tril().view({1, 1, C, C, 1}) &
                 rc.view({B, n, 1, C, 1});
  auto expo = ac.unsqueeze(2) - m_slot.unsqueeze(3);           // [B, n, T, S, K]
  auto w = torch::where(visible, expo, torch::full({}, -inf, expo.options())).exp();
  auto z = w.sum(3);                                           // [B, n, T, K]
  auto num = torch::einsum("bntsk,bnsd->bntkd", {w, xc});     // [B, n, T, K, D]

  if (n > 1) {
    // Whole earlier chunks, each summarised against its own maximum, rescaled to M[t].
    auto e = torch::where(rc, ac - m_chunk.unsqueeze(2), torch::full({}, -inf, ac.options())).exp();
    auto zc = e.sum(2);                                        // [B, n, K]
    auto nc = torch::einsum("bnsk,bnsd->bnkd", {e, xc});      // [B, n, K, D]
    at::Tensor u;
    {
      torch::NoGradGuard no_grad;
      auto earlier = torch::ones({n, n}, x.options().dtype(at::kBool)).tril(-1);  // [c, c'] c' < c
      auto ex = m_chunk.view({B, 1, 1, n, K}) - m_slot.unsqueeze(3);             // [B, n, T, n', K]
      auto use = earlier.view({1, n, 1, n, 1}) & chunk_real.view({B, 1, 1, n, K});
      u = torch::where(use, ex, torch::full({}, -inf, ex.options())).exp();
    }
    z = z + torch::einsum("bntck,bck->bntk", {u, zc});
    num = num + torch::einsum("bntck,bckd->bntkd", {u, nc});
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
  auto kh = keys.view({B, L, K, H, Dh}).permute({0, 3, 1, 2, 4});
  auto vh = values.view({B, L, K, H, Dh}).permute({0, 3, 1, 2, 4});
  auto scores = torch::matmul(kh, q.unsqueeze(-1)).squeeze(-1) / std::sqrt(static_cast<double>(Dh));
  auto p = ops::dropout(torch::softmax(scores, -1), dropout, training);  // [B, H, L, k]
  return torch::matmul(p.unsqueeze(-2), vh).squeeze(-2);               // [B, H, L, Dh]
}

}  // namespace seqrec::ops
