#pragma once
// Linear attention: (KᵀV) first, so the cost is O(L·Dh²) per head instead of O(L²·Dh).
// Two layers: a generic causal linear-attention product computed chunk by chunk, and LinRec's
// (Liu et al., SIGIR'23) ELU + L2-normalised feature maps on top of it. The product has a fused
// CPU kernel, a fused CUDA kernel (linear_attention.cu) and an ATen reference that runs on any
// device and differentiates through autograd.
#include <ATen/core/Tensor.h>

#include <string>

namespace seqrec::ops {

// out[t] = sum_{s <= t} (q[t] · k[s]) v[s] for q, k, v [B, H, L, Dh] (value width may differ).
// What the models call. On the CPU (float, double) it runs the fused kernel of
// linear_attention_fused.cpp: per sequence a [Dh x Dv] state walked slot by slot, forward and a
// hand-written backward, O(L·Dh·Dv) time and nothing saved beyond the inputs (`chunk` unused).
// On a CUDA device (float, double, Dh and Dv <= 256, in a build with CUDA) it runs the kernel
// of linear_attention.cu: the state in registers, the sequence walked in staged chunks, the
// backward as three runs of the same kernel. Elsewhere it runs
// causal_linear_attention_reference. First-order gradients only.
// `initial_state` (optional, [B, H, Dh, Dv], q's dtype and device) is a state every slot starts
// from: out[t] = q[t] · (initial_state + sum_{s <= t} k[s] vᵀ[s]), with its gradient (keys and
// values ahead of every slot, LinRec's pad keys among them). The CPU kernel starts its walk from
// it; elsewhere q · initial_state is added to the product.
at::Tensor causal_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   int64_t chunk = 64, const at::Tensor& initial_state = {});

// The ATen reference of the same product (any device, autograd): exact, computed in the fewest
// chunks n of at most `chunk` slots, each C = ceil(L / n) wide (so fewer than n slots are
// padding): inside a chunk a masked [C x C] product, across chunks an exclusive prefix sum of
// the [Dh x Dv] states kᵀv. Memory O(L·chunk + L/chunk·Dh·Dv).
at::Tensor causal_linear_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             int64_t chunk = 64, const at::Tensor& initial_state = {});

// out[t] = sum_s (q[t] · k[s]) v[s] over every slot s (the non-causal product, LinRec's global
// form): on the CPU (float, double) a fused kernel, sequence by sequence, with a hand-written
// backward; elsewhere global_linear_attention_reference, q (kᵀ v) as two batched products.
at::Tensor global_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
at::Tensor global_linear_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The argument checks both run (throws c10::Error naming the bad shape, chunk or initial state).
void check_linear_attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t chunk,
                                 const at::Tensor& initial_state = {});

// How LinRec normalises queries and keys after ELU:
//  kPaper: the paper's Eq. (6): each query row / (sqrt(Dh)·||q||₂); each key feature (column)
//          / (sqrt(n)·||k[:, j]||₂) over the n real keys it is combined with.
//  kCode:  the released code: queries and keys each / ||·||₂ per token, output / sqrt(Dh).
enum class LinrecNorm { kPaper, kCode };
LinrecNorm parse_linrec_norm(const std::string& name);  // "paper" | "code"; throws naming it
const char* linrec_norm_name(LinrecNorm norm);

// How far each query sees:
//  kCausal: slot t combines the real keys s <= t, and the paper's column norm runs over that
//           prefix too (prefix sums of k², of the key count and of kᵀv): every slot is a valid
//           next-item state, so SASRec-style every-position training works.
//  kGlobal: the paper's non-causal form: every slot combines all real keys of the sequence.
//           Only the last slot is free of future items: for last-position training/scoring.
enum class LinrecForm { kCausal, kGlobal };
LinrecForm parse_linrec_form(const std::string& name);  // "causal" | "global"
const char* linrec_form_name(LinrecForm form);

// Extra keys for LinRec's released code, which masks nothing (--linrec_pad_keys): count[b]
// copies of one key and value taking part in sequence b's sums and norms as real keys do, ahead
// of every slot (so in the causal form every query sees all of them). key [H, Dk] before ELU,
// value [H, Dv], in the op's dtype (float32 for the bfloat16 entries) and on its device; count
// [B] int64 >= 0. Copies of one key are one rank-one term of KᵀV, one term of the key norms and
// of the count, so they cost O(H·Dk·Dv) per sequence whatever their number (in the causal form
// the rank-one term is the causal product's initial state); key and value get gradients (each
// sequence's, summed in order).
struct LinrecPadKeys {
  at::Tensor key, value, count;
  bool defined() const { return count.defined(); }
};
// The same from a packed key-then-value row kv [2·D] (`heads` heads of D / heads each).
LinrecPadKeys linrec_pad_keys_packed(const at::Tensor& kv, int64_t heads, const at::Tensor& count);

// q, k, v: [B, H, L, Dh]; key_padding [B, L] bool, true at padded slots. Padded keys take no
// part (neither in the sums nor in the norms); outputs at padded slots are not defined beyond
// being finite (callers zero them). `pad_keys` (optional) adds its copies to every sequence.
// On the CPU (float, double, unless --fused_kernels=false) the global form with the paper's
// normalisation runs linrec_fused.cpp's kernel: ELU, the normalisation and the product in two
// passes per sequence each way, its output laid out [B, L, H, Dv] (merging the heads is a view);
// every other case runs linrec_attention_reference.
at::Tensor linrec_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_padding, LinrecNorm norm, LinrecForm form,
                            const LinrecPadKeys& pad_keys = {});

// The same op on the packed projection the model computes: qkv [B, L, 3·D] (queries, keys,
// values, each `heads` heads of D / heads) -> [B, L, D], the heads merged. On the CPU the fused
// kernel reads the heads in place and returns qkv's gradient as one tensor; elsewhere the heads
// are split, passed to linrec_attention and merged.
at::Tensor linrec_attention_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_padding,
                                   LinrecNorm norm, LinrecForm form, const LinrecPadKeys& pad_keys = {});

// The global form at the last slot alone: q [B, D] (the last slot's query projection) and kv
// [B, L, 2·D] (every slot's keys, then values), `heads` heads of D / heads -> [B, D], equal to
// linrec_attention_packed(qkv, heads, key_padding, norm, kGlobal)[:, L - 1] without the other
// slots' queries (what a model's last block needs under the last-slot objective). On the CPU
// with the paper's normalisation linrec_fused.cpp's kernel walks the keys and one query; every
// other case runs linrec_attention_reference with one query row.
at::Tensor linrec_attention_last(const at::Tensor& q, const at::Tensor& kv, int64_t heads,
                                 const at::Tensor& key_padding, LinrecNorm norm, const LinrecPadKeys& pad_keys = {});

// `--matmul_precision medium`'s forms of the two entries above: each projection as
// ops::product_bf16 returns it, a bfloat16 product before its float32 bias, and the output in
// bfloat16, as the output projection's product takes it. packed: product [B, L, 3·D], bias
// [3·D] -> [B, L, D]; last: the last slot's query product [B, D] and bias [D], every slot's keys'
// and values' product [B, L, 2·D] and bias [2·D] -> [B, D]. Each equals, values and gradients, the
// float32 entry on product.to(float) + bias with its result rounded to bfloat16. On the CPU with
// the paper's normalisation in the global form the fused kernel runs, each sequence's rows
// widened and biased as a pass reads them and rounded as it writes them (the same float32
// arithmetic, so the same bits; the biases' gradients are each sequence's sums in float, added
// in order in double, the same at any thread count); every other case runs that composition.
at::Tensor linrec_attention_packed_bf16(const at::Tensor& product, const at::Tensor& bias, int64_t heads,
                                        const at::Tensor& key_padding, LinrecNorm norm, LinrecForm form,
                                        const LinrecPadKeys& pad_keys = {});
at::Tensor linrec_attention_last_bf16(const at::Tensor& q, const at::Tensor& q_bias, const at::Tensor& kv,
                                      const at::Tensor& kv_bias, int64_t heads, const at::Tensor& key_padding,
                                      LinrecNorm norm, const LinrecPadKeys& pad_keys = {});

// The ATen composition of the same op (ELU, the norms, the scale, then causal_linear_attention
// or global_linear_attention), differentiated by autograd: what the fused kernel is tested
// against, and what runs on other devices. In the global form q may hold fewer rows than k
// ([B, H, Lq, Dh]; each sees every real key).
at::Tensor linrec_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& key_padding, LinrecNorm norm, LinrecForm form,
                                      const LinrecPadKeys& pad_keys = {});

// Whether the fused CPU kernels of this folder (the products' and LinRec's) take q: fused
// kernels on, q on the CPU, float or double.
bool cpu_kernel_takes(const at::Tensor& q);

// The fused LinRec kernel's entries (linrec_fused.cpp), for the ones above: no argument checks.
at::Tensor linrec_global_paper_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_padding, const LinrecPadKeys& pad_keys = {});
at::Tensor linrec_global_paper_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_padding,
                                      const LinrecPadKeys& pad_keys = {});
at::Tensor linrec_global_paper_last(const at::Tensor& q, const at::Tensor& kv, int64_t heads,
                                    const at::Tensor& key_padding, const LinrecPadKeys& pad_keys = {});
at::Tensor linrec_global_paper_packed_bf16(const at::Tensor& product, const at::Tensor& bias, int64_t heads,
                                          const at::Tensor& key_padding, const LinrecPadKeys& pad_keys = {});
at::Tensor linrec_global_paper_last_bf16(const at::Tensor& q, const at::Tensor& q_bias, const at::Tensor& kv,
                                         const at::Tensor& kv_bias, int64_t heads, const at::Tensor& key_padding,
                                         const LinrecPadKeys& pad_keys = {});

}  // namespace seqrec::ops
