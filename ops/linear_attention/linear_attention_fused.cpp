// causal_linear_attention's kernels: on the CPU the running state walked slot by slot, with a
// hand-written backward (see linear_attention.h); on a CUDA device the autograd wrapper of
// linear_attention.cu's kernel.
//
// Per sequence (b, h), with S = sum_{s <= t} k[s] vᵀ[s], a [Dk x Dv] state that stays in L1:
//     forward:        S += k[t] vᵀ[t];   out[t] = q[t]ᵀ S                       (t = 0 .. L-1)
//     backward, up:   the forward of (gout, v, k): gq[t] = S gout[t], with Sᵀ as its state
//     backward, down: G += q[t] goutᵀ[t]; gk[t] = G v[t];  gv[t] = Gᵀ k[t]       (t = L-1 .. 0)
// where G = sum_{t' >= t} q[t'] goutᵀ[t']. An initial state S₀ (causal_linear_attention's
// `initial_state`) is where S starts forward and Sᵀ in the up pass; its gradient is G at t = 0,
// sum_t q[t] goutᵀ[t]. Every product is one pass over a row of S or G per
// key feature, 7·Dk·Dv multiply-adds per slot in all, half the chunked reference's and none of
// its [chunk x chunk] score blocks or per-chunk states; nothing but the inputs is saved for the
// backward. A slot's output reads only slots <= t, in the same order whatever follows, so a
// later slot cannot change an earlier output even by rounding.
//
// The global form (every slot combines every slot) runs the same way, below.
//
// On x86-64 the loops are compiled twice, for the baseline and for AVX2 + FMA, and the second is
// taken when the CPU has both. Against the chunked reference: 3x at B 128, L 200, Dh 50, forward
// and backward, 1 thread (docs/benchmarks.md).
#include "ops/linear_attention/linear_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cpu_features.h"
#include "ops/kernels.h"
#include "ops/linear_attention/row_sums.h"
#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include "ops/cuda_launch.h"
#include "ops/linear_attention/linear_attention_cuda.h"
#endif

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The three passes over one sequence: q, k [L, Dk], v, gout [L, Dv], all contiguous; S is a
// [Dk x Dv] scratch buffer; S0 the initial state [Dk x Dv] (null: zeros). always_inline so that
// each instantiation is compiled inside the (baseline or AVX2) function that calls it.
template <typename T>
__attribute__((always_inline)) inline void forward_seq(const T* __restrict__ q, const T* __restrict__ k,
                                                       const T* __restrict__ v, T* __restrict__ out,
                                                       T* __restrict__ S, int64_t L, int64_t Dk, int64_t Dv,
                                                       const T* __restrict__ S0) {
  if (S0) std::copy(S0, S0 + Dk * Dv, S);
  else std::fill(S, S + Dk * Dv, T(0));
  for (int64_t t = 0; t < L; ++t) {
    const T* kt = k + t * Dk;
    const T* qt = q + t * Dk;
    const T* vt = v + t * Dv;
    T* ot = out + t * Dv;
    std::fill(ot, ot + Dv, T(0));
    for (int64_t i = 0; i < Dk; ++i) {
      const T ki = kt[i], qi = qt[i];
      T* __restrict__ row = S + i * Dv;
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) {
        row[j] += ki * vt[j];
        ot[j] += qi * row[j];
      }
    }
  }
}

// S0T: the initial state transposed [Dv x Dk], and gS0 its gradient [Dk x Dv] (both null: none).
template <typename T>
__attribute__((always_inline)) inline void backward_seq(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, const T* __restrict__ g,
                                                        T* __restrict__ gq, T* __restrict__ gk, T* __restrict__ gv,
                                                        T* __restrict__ S, int64_t L, int64_t Dk, int64_t Dv,
                                                        const T* __restrict__ S0T, T* __restrict__ gS0) {
  // Up: gq[t] = sum_{s <= t} (gout[t] · v[s]) k[s], the forward with (q, k, v) -> (gout, v, k):
  // its state is Sᵀ, so gq is a sum of rows rather than Dk dot products.
  forward_seq(g, v, k, gq, S, L, Dv, Dk, S0T);
  // Down: G (in S's buffer) collects q[t'] goutᵀ[t'] for t' >= t.
  std::fill(S, S + Dk * Dv, T(0));
  for (int64_t t = L - 1; t >= 0; --t) {
    const T* qt = q + t * Dk;
    const T* kt = k + t * Dk;
    const T* vt = v + t * Dv;
    const T* gt = g + t * Dv;
    T* gkt = gk + t * Dk;
    T* gvt = gv + t * Dv;
    std::fill(gvt, gvt + Dv, T(0));
    for (int64_t i = 0; i < Dk; ++i) {
      const T qi = qt[i], ki = kt[i];
      T* __restrict__ row = S + i * Dv;
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < Dv; ++j) {
        row[j] += qi * gt[j];
        acc += row[j] * vt[j];
        gvt[j] += ki * row[j];
      }
      gkt[i] = acc;
    }
  }
  if (gS0) std::copy(S, S + Dk * Dv, gS0);
}

// The global (non-causal) form, out[t] = q[t]ᵀ S with S = sum over every slot of k[s] vᵀ[s]:
//     forward:  S = sum_s k[s] vᵀ[s];  out[t] = q[t]ᵀ S
//     backward: gq[t] = S gout[t];  G = sum_t q[t] goutᵀ[t];  gk[s] = G v[s];  gv[s] = Gᵀ k[s]
// 2·Dk·Dv multiply-adds per slot forward and 5 backward (S recomputed), one pass over a row of
// S or G per key feature, in place of two batched products each way: with the heads' strided
// layout in LinRec 2-3% off a training step, though alone on contiguous inputs the batched
// products are faster (docs/benchmarks.md).
template <typename T>
__attribute__((always_inline)) inline void outer_sum(const T* __restrict__ a, const T* __restrict__ b,
                                                     T* __restrict__ S, int64_t L, int64_t Da, int64_t Db) {
  std::fill(S, S + Da * Db, T(0));
  for (int64_t t = 0; t < L; ++t) add_outer<T, 0>(S, a + t * Da, b + t * Db, Da, Db);
}

template <typename T>
__attribute__((always_inline)) inline void global_forward_seq(const T* __restrict__ q, const T* __restrict__ k,
                                                              const T* __restrict__ v, T* __restrict__ out,
                                                              T* __restrict__ S, int64_t L, int64_t Dk, int64_t Dv) {
  outer_sum(k, v, S, L, Dk, Dv);
  for (int64_t t = 0; t < L; ++t) weighted_rows<T, 0>(q + t * Dk, S, Dk, Dv, out + t * Dv);
}

// S holds 2·Dk·Dv: S, then G.
template <typename T>
__attribute__((always_inline)) inline void global_backward_seq(const T* __restrict__ q, const T* __restrict__ k,
                                                               const T* __restrict__ v, const T* __restrict__ g,
                                                               T* __restrict__ gq, T* __restrict__ gk,
                                                               T* __restrict__ gv, T* __restrict__ S, int64_t L,
                                                               int64_t Dk, int64_t Dv) {
  T* __restrict__ G = S + Dk * Dv;
  outer_sum(k, v, S, L, Dk, Dv);
  outer_sum(q, g, G, L, Dk, Dv);
  for (int64_t t = 0; t < L; ++t) {
    const T* kt = k + t * Dk;
    const T* vt = v + t * Dv;
    const T* gt = g + t * Dv;
    T* gqt = gq + t * Dk;
    T* gkt = gk + t * Dk;
    T* __restrict__ gvt = gv + t * Dv;
    std::fill(gvt, gvt + Dv, T(0));
    for (int64_t i = 0; i < Dk; ++i) {
      const T ki = kt[i];
      const T* __restrict__ srow = S + i * Dv;
      const T* __restrict__ grow = G + i * Dv;
      T aq = 0, ak = 0;
#pragma omp simd reduction(+ : aq, ak)
      for (int64_t j = 0; j < Dv; ++j) {
        aq += srow[j] * gt[j];
        ak += grow[j] * vt[j];
        gvt[j] += ki * grow[j];
      }
      gqt[i] = aq;
      gkt[i] = ak;
    }
  }
}

// Scratch elements per sequence of either form's passes.
inline int64_t scratch_elements(bool global, int64_t Dk, int64_t Dv) { return (global ? 2 : 1) * Dk * Dv; }

// The causal form's initial state (S0, S0T, gS0 as backward_seq takes them; the global form has
// none).
template <typename T, bool kGlobal>
__attribute__((always_inline)) inline void forward_any(const T* q, const T* k, const T* v, T* out, T* S, int64_t L,
                                                       int64_t Dk, int64_t Dv, const T* S0) {
  if (kGlobal)
    global_forward_seq(q, k, v, out, S, L, Dk, Dv);
  else
    forward_seq(q, k, v, out, S, L, Dk, Dv, S0);
}
template <typename T, bool kGlobal>
__attribute__((always_inline)) inline void backward_any(const T* q, const T* k, const T* v, const T* g, T* gq, T* gk,
                                                        T* gv, T* S, int64_t L, int64_t Dk, int64_t Dv, const T* S0T,
                                                        T* gS0) {
  if (kGlobal)
    global_backward_seq(q, k, v, g, gq, gk, gv, S, L, Dk, Dv);
  else
    backward_seq(q, k, v, g, gq, gk, gv, S, L, Dk, Dv, S0T, gS0);
}

#if SEQREC_CPU_X86
template <typename T, bool kGlobal>
SEQREC_CPU_AVX2 void forward_avx2(const T* q, const T* k, const T* v, T* out, T* S, int64_t L, int64_t Dk,
                                  int64_t Dv, const T* S0) {
  forward_any<T, kGlobal>(q, k, v, out, S, L, Dk, Dv, S0);
}
template <typename T, bool kGlobal>
SEQREC_CPU_AVX2 void backward_avx2(const T* q, const T* k, const T* v, const T* g, T* gq, T* gk, T* gv, T* S,
                                   int64_t L, int64_t Dk, int64_t Dv, const T* S0T, T* gS0) {
  backward_any<T, kGlobal>(q, k, v, g, gq, gk, gv, S, L, Dk, Dv, S0T, gS0);
}
#endif

template <typename T, bool kGlobal>
void forward_one(const T* q, const T* k, const T* v, T* out, T* S, int64_t L, int64_t Dk, int64_t Dv, const T* S0) {
#if SEQREC_CPU_X86
  if (cpu_has_avx2_fma()) return forward_avx2<T, kGlobal>(q, k, v, out, S, L, Dk, Dv, S0);
#endif
  forward_any<T, kGlobal>(q, k, v, out, S, L, Dk, Dv, S0);
}
template <typename T, bool kGlobal>
void backward_one(const T* q, const T* k, const T* v, const T* g, T* gq, T* gk, T* gv, T* S, int64_t L,
                  int64_t Dk, int64_t Dv, const T* S0T, T* gS0) {
#if SEQREC_CPU_X86
  if (cpu_has_avx2_fma()) return backward_avx2<T, kGlobal>(q, k, v, g, gq, gk, gv, S, L, Dk, Dv, S0T, gS0);
#endif
  backward_any<T, kGlobal>(q, k, v, g, gq, gk, gv, S, L, Dk, Dv, S0T, gS0);
}

// Either form on the CPU, sequence by sequence (kGlobal: every slot sees every slot); Self names
// the autograd node. `initial` is the causal form's initial state [B, H, Dk, Dv], or (none, and
// always in the global form) an empty one-dimensional tensor: LibTorch 1.13's Function::apply
// refuses undefined inputs.
template <bool kGlobal, class Self>
class LinearAttentionFused : public torch::autograd::Function<Self> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& initial_in) {
    auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const bool has_initial = !kGlobal && initial_in.dim() == 4;
    auto initial = has_initial ? initial_in.contiguous() : at::Tensor();
    const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dk = q.size(3), Dv = v.size(3);
    auto out = torch::empty({B, H, L, Dv}, v.options());
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_linear_attention_fused", [&] {
      const auto *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
      const scalar_t* s0 = has_initial ? initial.data_ptr<scalar_t>() : nullptr;
      auto* op = out.data_ptr<scalar_t>();
      at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        std::vector<scalar_t> S(scratch_elements(kGlobal, Dk, Dv));
        for (int64_t s = begin; s < end; ++s)
          forward_one<scalar_t, kGlobal>(qp + s * L * Dk, kp + s * L * Dk, vp + s * L * Dv, op + s * L * Dv, S.data(),
                                         L, Dk, Dv, s0 ? s0 + s * Dk * Dv : nullptr);
      });
    });
    ctx->save_for_backward({q, k, v});
    // Only the backward's up pass reads the initial state, as its transpose.
    ctx->saved_data["initial_t"] = has_initial ? initial.transpose(2, 3).contiguous() : at::Tensor();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor initial_t = ctx->saved_data["initial_t"].toTensor();
    const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dk = q.size(3), Dv = v.size(3);
    auto g = grads[0].contiguous();
    auto gq = torch::empty_like(q), gk = torch::empty_like(k), gv = torch::empty_like(v);
    auto ginitial = initial_t.defined() ? torch::empty({B, H, Dk, Dv}, q.options()) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_linear_attention_fused_backward", [&] {
      const auto *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>(),
                 *gp = g.data_ptr<scalar_t>();
      auto *gqp = gq.data_ptr<scalar_t>(), *gkp = gk.data_ptr<scalar_t>(), *gvp = gv.data_ptr<scalar_t>();
      const scalar_t* s0t = initial_t.defined() ? initial_t.data_ptr<scalar_t>() : nullptr;
      scalar_t* gs0 = ginitial.defined() ? ginitial.data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        std::vector<scalar_t> S(scratch_elements(kGlobal, Dk, Dv));
        for (int64_t s = begin; s < end; ++s)
          backward_one<scalar_t, kGlobal>(qp + s * L * Dk, kp + s * L * Dk, vp + s * L * Dv, gp + s * L * Dv,
                                          gqp + s * L * Dk, gkp + s * L * Dk, gvp + s * L * Dv, S.data(), L, Dk, Dv,
                                          s0t ? s0t + s * Dk * Dv : nullptr, gs0 ? gs0 + s * Dk * Dv : nullptr);
      });
    });
    return {gq, gk, gv, ginitial};
  }
};

// The initial state as LinearAttentionFused takes it.
at::Tensor initial_input(const at::Tensor& initial_state) {
  return initial_state.defined() ? initial_state : torch::empty({0});
}
class CausalLinearAttentionFused : public LinearAttentionFused<false, CausalLinearAttentionFused> {};
class GlobalLinearAttentionFused : public LinearAttentionFused<true, GlobalLinearAttentionFused> {};


#if SEQREC_HAVE_CUDA
// The same product on a CUDA device: linear_attention.cu's kernel forward, and three runs of it
// (one forward, two reversed) for the backward.
bool cuda_kernel_takes(const at::Tensor& q, const at::Tensor& v) {
  return fused_kernels() && q.is_cuda() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble) &&
         q.size(3) <= cuda::kLinearAttentionMaxWidth && v.size(3) <= cuda::kLinearAttentionMaxWidth;
}

// out = op(a, b, c) over [B, H, L, *] contiguous tensors on one device.
at::Tensor cuda_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, bool reverse) {
  const int64_t n = a.size(0) * a.size(1), L = a.size(2), dk = a.size(3), dv = c.size(3);
  auto out = torch::empty({a.size(0), a.size(1), L, dv}, c.options());
  const CudaLaunch launch(a);
  const int64_t seg_len = cuda::causal_linear_attention_segment_len(n, L, dv);
  const int64_t scratch = cuda::linear_kernel::workspace_elements(n, L, dk, dv, seg_len);
  const auto sums = scratch > 0 ? torch::empty({scratch}, c.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "causal_linear_attention_cuda", [&] {
    cuda::causal_linear_attention_launch<scalar_t>(
        a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), c.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, L, dk,
        dv, reverse, seg_len, scratch > 0 ? sums.data_ptr<scalar_t>() : nullptr, launch.stream());
  });
  return out;
}

class CausalLinearAttentionCuda : public torch::autograd::Function<CausalLinearAttentionCuda> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in) {
    auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    ctx->save_for_backward({q, k, v});
    return {cuda_product(q, k, v, /*reverse=*/false)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor operands[4] = {q, k, v, grads[0].contiguous()};
    variable_list out;
    for (const auto& p : cuda::kBackwardProducts)
      out.push_back(cuda_product(operands[p.a], operands[p.b], operands[p.c], p.reverse));
    return out;
  }
};
#endif

}  // namespace

// The CPU kernels take float and double on the CPU, unless --fused_kernels=false.
bool cpu_kernel_takes(const at::Tensor& q) {
  return fused_kernels() && q.device().is_cpu() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble);
}

at::Tensor causal_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   int64_t chunk, const at::Tensor& initial_state) {
  check_linear_attention_args(q, k, v, chunk, initial_state);
  const bool empty = q.numel() == 0 || v.numel() == 0;
#if SEQREC_HAVE_CUDA
  if (cuda_kernel_takes(q, v)) {
    if (empty) return torch::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options());
    // The CUDA kernel starts from zeros: the initial state's share is one more product.
    auto out = CausalLinearAttentionCuda::apply(q, k, v)[0];
    return initial_state.defined() ? out + torch::matmul(q, initial_state) : out;
  }
#endif
  if (!cpu_kernel_takes(q)) return causal_linear_attention_reference(q, k, v, chunk, initial_state);
  if (empty) return torch::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options());
  return CausalLinearAttentionFused::apply(q, k, v, initial_input(initial_state))[0];
}

at::Tensor global_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_linear_attention_args(q, k, v, /*chunk=*/1);
  if (!cpu_kernel_takes(q)) return global_linear_attention_reference(q, k, v);
  if (q.numel() == 0 || v.numel() == 0) return torch::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options());
  return GlobalLinearAttentionFused::apply(q, k, v, initial_input({}))[0];
}

}  // namespace seqrec::ops
