#include "ops/linear_attention/linear_attention.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "ops/kernels.h"
#include "ops/op_checks.h"

namespace seqrec::ops {
namespace {

// Guards divisions by norms of all-zero rows (padded slots, all-padding prefixes).
constexpr double kEps = 1e-12;

// q [B, H, Lq, Dh], k [B, H, L, Dh], v [B, H, L, Dv]; Lq == L unless `fewer_queries` (the global
// form, where each query sees every key).
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool fewer_queries = false) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [B, H, L, Dh]; got q ",
              q.sizes(), " k ", k.sizes(), " v ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3) &&
                  (fewer_queries || q.size(2) == k.size(2)),
              "q and k must have one shape; got q ", q.sizes(), " k ", k.sizes());
  TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2),
              "v must be [B, H, L, Dv] matching k ", k.sizes(), "; got ", v.sizes());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k, v must have one dtype; got q ", q.scalar_type(), " k ", k.scalar_type(), " v ", v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), "q, k, v must be on one device; got q ",
              q.device(), " k ", k.device(), " v ", v.device());
}

}  // namespace

void check_linear_attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t chunk,
                                 const at::Tensor& initial_state) {
  check_qkv(q, k, v);
  TORCH_CHECK(chunk > 0, "chunk must be > 0, got ", chunk);
  if (!initial_state.defined()) return;
  TORCH_CHECK(initial_state.dim() == 4 && initial_state.size(0) == q.size(0) && initial_state.size(1) == q.size(1) &&
                  initial_state.size(2) == q.size(3) && initial_state.size(3) == v.size(3),
              "initial_state must be [B, H, Dh, Dv] = [", q.size(0), ", ", q.size(1), ", ", q.size(3), ", ", v.size(3),
              "]; got ", initial_state.sizes());
  TORCH_CHECK(initial_state.scalar_type() == q.scalar_type() && initial_state.device() == q.device(),
              "initial_state must be ", q.scalar_type(), " on ", q.device(), "; got ", initial_state.scalar_type(),
              " on ", initial_state.device());
}

at::Tensor global_linear_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_qkv(q, k, v, /*fewer_queries=*/true);
  return torch::matmul(q, torch::matmul(k.transpose(-2, -1), v));
}

at::Tensor causal_linear_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             int64_t chunk, const at::Tensor& initial_state) {
  check_linear_attention_args(q, k, v, chunk, initial_state);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3), Dv = v.size(3);
  if (L == 0) return torch::zeros({B, H, 0, Dv}, v.options());
  if (initial_state.defined())
    return causal_linear_attention_reference(q, k, v, chunk) + torch::matmul(q, initial_state);
  // The fewest chunks of at most `chunk` slots, evened out: L = 200 at chunk 64 runs 4 chunks
  // of 50 rather than 4 of 64 over 56 padded slots (the op a third faster at d 50).
  const int64_t n = (L + chunk - 1) / chunk, C = (L + n - 1) / n, Lp = n * C;
  // Zero slots appended at the end change no earlier output.
  auto pad = [&](const at::Tensor& t) {
    return Lp == L ? t : torch::constant_pad_nd(t, {0, 0, 0, Lp - L});
  };
  auto qc = pad(q).reshape({B, H, n, C, Dh});
  auto kc = pad(k).reshape({B, H, n, C, Dh});
  auto vc = pad(v).reshape({B, H, n, C, Dv});
  auto causal = torch::ones({C, C}, q.options().dtype(at::kBool)).tril();
  auto scores = torch::matmul(qc, kc.transpose(-2, -1)).masked_fill(causal.logical_not(), 0.0);
  auto out = torch::matmul(scores, vc);  // within each chunk
  if (n > 1) {
    auto states = torch::matmul(kc.transpose(-2, -1), vc);  // [B, H, n, Dh, Dv]
    // Exclusive prefix over chunks by shifting (not cumsum - states, whose rounding would let
    // a chunk's own keys leak into its earlier slots).
    auto before = torch::constant_pad_nd(torch::cumsum(states.narrow(2, 0, n - 1), 2), {0, 0, 0, 0, 1, 0});
    out = out + torch::matmul(qc, before);
  }
  out = out.reshape({B, H, Lp, Dv});
  return Lp == L ? out : out.narrow(2, 0, L);
}

LinrecNorm parse_linrec_norm(const std::string& name) {
  if (name == "paper") return LinrecNorm::kPaper;
  if (name == "code") return LinrecNorm::kCode;
  throw std::invalid_argument("unknown LinRec normalisation '" + name + "' (known: paper, code)");
}
const char* linrec_norm_name(LinrecNorm norm) { return norm == LinrecNorm::kPaper ? "paper" : "code"; }

LinrecForm parse_linrec_form(const std::string& name) {
  if (name == "causal") return LinrecForm::kCausal;
  if (name == "global") return LinrecForm::kGlobal;
  throw std::invalid_argument("unknown LinRec form '" + name + "' (known: causal, global)");
}
const char* linrec_form_name(LinrecForm form) { return form == LinrecForm::kCausal ? "causal" : "global"; }

namespace {

void check_linrec_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& key_padding, bool fewer_queries = false) {
  check_qkv(q, k, v, fewer_queries);
  detail::check_key_padding(key_padding, k.size(0), k.size(2));
}

// Pad keys for B sequences of H heads, keys Dk and values Dv wide, of `dtype` on `device`.
void check_pad_keys(const LinrecPadKeys& p, int64_t B, int64_t H, int64_t Dk, int64_t Dv, at::ScalarType dtype,
                    at::Device device) {
  if (!p.defined()) return;
  TORCH_CHECK(p.key.defined() && p.value.defined() && p.key.dim() == 2 && p.key.size(0) == H &&
                  p.key.size(1) == Dk && p.value.dim() == 2 && p.value.size(0) == H && p.value.size(1) == Dv,
              "pad_keys: key must be [H, Dk] = [", H, ", ", Dk, "] and value [H, Dv] = [", H, ", ", Dv, "]; got key ",
              p.key.defined() ? p.key.sizes() : at::IntArrayRef{}, " value ",
              p.value.defined() ? p.value.sizes() : at::IntArrayRef{});
  TORCH_CHECK(p.key.scalar_type() == dtype && p.value.scalar_type() == dtype && p.key.device() == device &&
                  p.value.device() == device,
              "pad_keys: key and value must be ", dtype, " on ", device, "; got ", p.key.scalar_type(), " on ",
              p.key.device(), " and ", p.value.scalar_type(), " on ", p.value.device());
  TORCH_CHECK(p.count.dim() == 1 && p.count.size(0) == B && p.count.scalar_type() == at::kLong &&
                  p.count.device() == device,
              "pad_keys: count must be int64 [B] = [", B, "] on ", device, "; got ", p.count.scalar_type(), " ",
              p.count.sizes(), " on ", p.count.device());
  // A device's counts would cost a synchronisation to read; the CPU's are read here.
  if (device.is_cpu() && B > 0) {
    const int64_t least = p.count.min().item<int64_t>();
    TORCH_CHECK(least >= 0, "pad_keys: count must be >= 0; got ", least);
  }
}

}  // namespace

LinrecPadKeys linrec_pad_keys_packed(const at::Tensor& kv, int64_t heads, const at::Tensor& count) {
  TORCH_CHECK(kv.dim() == 1 && heads > 0 && kv.size(0) % (2 * heads) == 0,
              "pad_keys: kv must be [2·D] with D split into ", heads, " heads; got ", kv.sizes());
  const int64_t D = kv.size(0) / 2;
  return {kv.narrow(0, 0, D).view({heads, D / heads}), kv.narrow(0, D, D).view({heads, D / heads}), count};
}

at::Tensor linrec_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_padding, LinrecNorm norm, LinrecForm form,
                            const LinrecPadKeys& pad_keys) {
  check_linrec_args(q, k, v, key_padding);
  check_pad_keys(pad_keys, k.size(0), k.size(1), k.size(3), v.size(3), q.scalar_type(), q.device());
  if (norm == LinrecNorm::kPaper && form == LinrecForm::kGlobal && cpu_kernel_takes(q))
    return linrec_global_paper_fused(q, k, v, key_padding, pad_keys);
  return linrec_attention_reference(q, k, v, key_padding, norm, form, pad_keys);
}

at::Tensor linrec_attention_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_padding,
                                   LinrecNorm norm, LinrecForm form, const LinrecPadKeys& pad_keys) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "qkv must be [B, L, 3·D]; got ", qkv.sizes());
  const int64_t B = qkv.size(0), L = qkv.size(1), D = qkv.size(2) / 3;
  TORCH_CHECK(heads > 0 && D % heads == 0, "the width ", D, " must split into heads; got heads = ", heads);
  if (norm == LinrecNorm::kPaper && form == LinrecForm::kGlobal && cpu_kernel_takes(qkv)) {
    detail::check_key_padding(key_padding, B, L);
    check_pad_keys(pad_keys, B, heads, D / heads, D / heads, qkv.scalar_type(), qkv.device());
    return linrec_global_paper_packed(qkv, heads, key_padding, pad_keys);
  }
  auto split = qkv.reshape({B, L, 3, heads, D / heads}).permute({2, 0, 3, 1, 4});  // 3 x [B, H, L, D / H]
  auto out = linrec_attention(split[0], split[1], split[2], key_padding, norm, form, pad_keys);
  return out.transpose(1, 2).reshape({B, L, D});
}

at::Tensor linrec_attention_last(const at::Tensor& q, const at::Tensor& kv, int64_t heads,
                                 const at::Tensor& key_padding, LinrecNorm norm, const LinrecPadKeys& pad_keys) {
  TORCH_CHECK(q.dim() == 2 && kv.dim() == 3 && kv.size(0) == q.size(0) && kv.size(2) == 2 * q.size(1),
              "linrec_attention_last takes q [B, D] and kv [B, L, 2·D]; got q ", q.sizes(), " kv ", kv.sizes());
  const int64_t B = kv.size(0), L = kv.size(1), D = q.size(1);
  TORCH_CHECK(heads > 0 && D % heads == 0, "the width ", D, " must split into heads; got heads = ", heads);
  detail::check_key_padding(key_padding, B, L);
  check_pad_keys(pad_keys, B, heads, D / heads, D / heads, kv.scalar_type(), kv.device());
  if (norm == LinrecNorm::kPaper && cpu_kernel_takes(kv) && q.scalar_type() == kv.scalar_type() &&
      q.device() == kv.device())
    return linrec_global_paper_last(q, kv, heads, key_padding, pad_keys);
  auto split = kv.reshape({B, L, 2, heads, D / heads}).permute({2, 0, 3, 1, 4});  // 2 x [B, H, L, D / H]
  auto qh = q.reshape({B, heads, 1, D / heads});
  return linrec_attention_reference(qh, split[0], split[1], key_padding, norm, LinrecForm::kGlobal, pad_keys)
      .reshape({B, D});
}

namespace {

// A bfloat16 product and its float32 bias as the float32 entries take them: widened, then the
// bias added in place (as ops::linear does).
at::Tensor biased(const at::Tensor& product, const at::Tensor& bias) {
  return product.to(at::kFloat).add_(bias);
}

void check_product_and_bias(const at::Tensor& product, const at::Tensor& bias, const char* name) {
  TORCH_CHECK(product.scalar_type() == at::kBFloat16 && bias.scalar_type() == at::kFloat && bias.dim() == 1 &&
                  bias.size(0) == product.size(-1) && bias.device() == product.device(),
              "the bfloat16 LinRec entries take a bfloat16 product and a float32 bias as wide as its rows; got ", name,
              " ", product.scalar_type(), " ", product.sizes(), " with bias ", bias.scalar_type(), " ", bias.sizes());
}

bool fused_bf16_takes(const at::Tensor& product) {
  return fused_kernels() && product.device().is_cpu() && product.numel() > 0;
}

}  // namespace

at::Tensor linrec_attention_packed_bf16(const at::Tensor& product, const at::Tensor& bias, int64_t heads,
                                        const at::Tensor& key_padding, LinrecNorm norm, LinrecForm form,
                                        const LinrecPadKeys& pad_keys) {
  check_product_and_bias(product, bias, "product");
  TORCH_CHECK(product.dim() == 3 && product.size(2) % 3 == 0, "product must be [B, L, 3·D]; got ", product.sizes());
  const int64_t D = product.size(2) / 3;
  TORCH_CHECK(heads > 0 && D % heads == 0, "the width ", D, " must split into heads; got heads = ", heads);
  if (norm == LinrecNorm::kPaper && form == LinrecForm::kGlobal && fused_bf16_takes(product)) {
    detail::check_key_padding(key_padding, product.size(0), product.size(1));
    check_pad_keys(pad_keys, product.size(0), heads, D / heads, D / heads, at::kFloat, product.device());
    return linrec_global_paper_packed_bf16(product, bias, heads, key_padding, pad_keys);
  }
  return linrec_attention_packed(biased(product, bias), heads, key_padding, norm, form, pad_keys).to(at::kBFloat16);
}

at::Tensor linrec_attention_last_bf16(const at::Tensor& q, const at::Tensor& q_bias, const at::Tensor& kv,
                                      const at::Tensor& kv_bias, int64_t heads, const at::Tensor& key_padding,
                                      LinrecNorm norm, const LinrecPadKeys& pad_keys) {
  check_product_and_bias(q, q_bias, "q");
  check_product_and_bias(kv, kv_bias, "kv");
  TORCH_CHECK(q.dim() == 2 && kv.dim() == 3 && kv.size(0) == q.size(0) && kv.size(2) == 2 * q.size(1) &&
                  q.device() == kv.device(),
              "linrec_attention_last_bf16 takes q [B, D] and kv [B, L, 2·D]; got q ", q.sizes(), " kv ", kv.sizes());
  const int64_t D = q.size(1);
  TORCH_CHECK(heads > 0 && D % heads == 0, "the width ", D, " must split into heads; got heads = ", heads);
  if (norm == LinrecNorm::kPaper && fused_bf16_takes(kv)) {
    detail::check_key_padding(key_padding, kv.size(0), kv.size(1));
    check_pad_keys(pad_keys, kv.size(0), heads, D / heads, D / heads, at::kFloat, kv.device());
    return linrec_global_paper_last_bf16(q, q_bias, kv, kv_bias, heads, key_padding, pad_keys);
  }
  return linrec_attention_last(biased(q, q_bias), biased(kv, kv_bias), heads, key_padding, norm, pad_keys)
      .to(at::kBFloat16);
}

at::Tensor linrec_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& key_padding, LinrecNorm norm, LinrecForm form,
                                      const LinrecPadKeys& pad_keys) {
  check_linrec_args(q, k, v, key_padding, /*fewer_queries=*/form == LinrecForm::kGlobal);
  check_pad_keys(pad_keys, k.size(0), k.size(1), k.size(3), v.size(3), q.scalar_type(), q.device());
  const double dh = static_cast<double>(q.size(3));
  // [B, 1, L, 1]: 1 at real slots, 0 at padding. Padded keys are zeroed, so they and their
  // values vanish from every sum (each product pairs a value with its own key).
  auto real = key_padding.logical_not().to(q.scalar_type()).unsqueeze(1).unsqueeze(-1);
  auto qe = torch::elu(q);
  auto ke = torch::elu(k) * real;
  const auto& vr = v;
  const bool causal = form == LinrecForm::kCausal;
  // The global product; its fused kernel takes as many queries as keys, fewer go by the reference.
  auto global = [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return a.size(2) == b.size(2) ? global_linear_attention(a, b, c) : global_linear_attention_reference(a, b, c);
  };

  // --linrec_pad_keys: count copies of one key (after ELU, [1, H, 1, Dk]) and value ([1, H, 1, Dv])
  // ahead of every slot; cnt [B, 1, 1, 1]. Their share of a query's output is one product with the
  // key, the copies' sum of squares one term of the column sums, their number one of the count.
  const bool padded = pad_keys.defined();
  at::Tensor pk, pv, cnt;
  if (padded) {
    pk = torch::elu(pad_keys.key).unsqueeze(0).unsqueeze(2);
    pv = pad_keys.value.unsqueeze(0).unsqueeze(2);
    cnt = pad_keys.count.to(q.scalar_type()).view({-1, 1, 1, 1});
  }
  // The product of queries w with keys kn (the pad key kp as the norm leaves it) and values, the
  // pad keys included: in the causal form their count · kpᵀ vp [B, H, Dk, Dv] is the state every
  // slot starts from; in the global form their share, (w · kp) · count · vp, is added.
  auto product = [&](const at::Tensor& w, const at::Tensor& kn, const at::Tensor& kp) {
    if (causal) {
      const auto initial = padded ? cnt * kp.transpose(2, 3).matmul(pv) : at::Tensor();
      return causal_linear_attention(w, kn, vr, /*chunk=*/64, initial);
    }
    auto out = global(w, kn, vr);
    return padded ? out + (w * kp).sum(-1, true) * cnt * pv : out;
  };

  if (norm == LinrecNorm::kCode) {
    auto qn = qe / qe.norm(2, -1, true).clamp_min(kEps);
    auto kn = ke / ke.norm(2, -1, true).clamp_min(kEps);
    return product(qn, kn, padded ? pk / pk.norm(2, -1, true).clamp_min(kEps) : pk) / std::sqrt(dh);
  }

  // Paper: rows of Q / (sqrt(Dh)·||q||); key feature j / (sqrt(n)·||k[:, j]||) where n and the
  // column norm cover the keys the query combines. The column scale is per (query, feature),
  // so it moves onto the query: q̃[t, j] = q[t, j] / (sqrt(n_t)·||k[<=t, j]||), then plain
  // linear attention of q̃ with the unnormalised keys.
  auto qn = qe / (qe.norm(2, -1, true).clamp_min(kEps) * std::sqrt(dh));
  at::Tensor col_sq, count;
  if (causal) {
    col_sq = torch::cumsum(ke * ke, 2);                      // [B, H, L, Dh]
    count = torch::cumsum(real, 2);                          // [B, 1, L, 1]
  } else {
    col_sq = (ke * ke).sum(2, true);                         // [B, H, 1, Dh]
    count = real.sum(2, true);                               // [B, 1, 1, 1]
  }
  if (padded) {
    col_sq = col_sq + cnt * pk * pk;
    count = count + cnt;
  }
  auto scale = (col_sq.clamp_min(kEps) * count.clamp_min(1.0)).rsqrt();
  return product(qn * scale, ke, pk);
}

}  // namespace seqrec::ops
