// routed_attention on CPU float/double: the reference's gathers, broadcast products and
// index_add backward replaced by one autograd Function with loops over raw rows; on a CUDA
// device the same arithmetic in routing_attention.cu's kernels, behind the same Function.
//
// Per sequence b, head h and real query slot i, with keys j_0..j_{W-1} = window(i) (the
// invalid ones skipped) and j_W = i (the query's own row, always valid):
//     l_n = scale·<r_i, r_{j_n}>,   p = softmax(l),   q_n = p_n·m_n,   out_i = sum_n q_n v_{j_n}
// where m is the dropout keep mask (1/(1-p) or 0; 1 without dropout). Backward, g = dL/dout_i:
//     dv_{j_n} += q_n g,   dp_n = m_n <g, v_{j_n}>,   dl_n = p_n (dp_n - sum_k p_k dp_k)
//     dr_i += scale·sum_n dl_n r_{j_n} (+ scale·dl_W r_i again: the query is also its own key)
//     dr_{j_n} += scale·dl_n r_i   (n < W)
// The forward keeps p [B, H, L, W + 1] (pre-dropout) and the mask; nothing of size L·W·d.
// The mask is ops::dropout_mask over [B, H, L, W + 1] with one ops::random_seed draw, exactly
// the tensor the reference's ops::dropout multiplies its probabilities [B, H, L, W + 1] by, so
// under one generator state the fused op and the reference drop the same probabilities.
#include "ops/routing_attention/routing_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/kernels.h"
#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include "ops/cuda_launch.h"
#include "ops/routing_attention/routing_attention_cuda.h"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Independent partial sums: a single running sum is a dependency chain the compiler may not
// reorder (no -ffast-math), eight of them vectorise.
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  constexpr int64_t kLanes = 8;
  T part[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) part[j] += a[k + j] * b[k + j];
  T sum = 0;
  for (; k < n; ++k) sum += a[k] * b[k];
  for (int64_t j = 0; j < kLanes; ++j) sum += part[j];
  return sum;
}

template <typename T>
inline void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) y[k] += alpha * x[k];
}

// Sizes and row pointers shared by the two passes. Rows are contiguous: r [B·H·L, d],
// v [B·H·L, dv], window and valid [B·H·L, W], probabilities and mask [B·H·L, W + 1].
template <typename T>
struct Rows {
  int64_t H, L, W, d, dv;
  const T* r;
  const T* v;
  const int64_t* window;
  const bool* valid;
  const bool* pad;  // [B, L]
  const T* mask;    // nullptr without dropout
  T scale;
  T keep(int64_t row, int64_t n) const { return mask ? mask[row * (W + 1) + n] : T(1); }
};

// Rows per parallel chunk: about 32k multiply-adds each, so that a chunk outweighs the cost of
// handing it to a thread.
int64_t grain(int64_t W, int64_t d, int64_t dv) { return std::max<int64_t>(1, 32768 / ((W + 1) * (d + dv))); }

// out [B·H·L, dv] and p [B·H·L, W + 1]; every (b, h, i) row is independent.
template <typename T>
void forward_rows(const Rows<T>& x, int64_t rows, T* out, T* probs) {
  const int64_t W = x.W, d = x.d, dv = x.dv, L = x.L;
  at::parallel_for(0, rows, grain(W, d, dv), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t bh = row / L, i = row % L;
      T* o = out + row * dv;
      T* p = probs + row * (W + 1);
      std::fill(o, o + dv, T(0));
      if (x.pad[(bh / x.H) * L + i]) {
        std::fill(p, p + W + 1, T(0));
        continue;
      }
      const T* rs = x.r + bh * L * d;
      const T* vs = x.v + bh * L * dv;
      const T* ri = rs + i * d;
      const int64_t* win = x.window + row * W;
      const bool* ok = x.valid + row * W;
      // Invalid keys score -inf after scaling, as in the reference: exactly zero probability.
      for (int64_t n = 0; n < W; ++n) p[n] = ok[n] ? x.scale * dot(ri, rs + win[n] * d, d) : kNegInf<T>;
      p[W] = x.scale * dot(ri, ri, d);
      const T top = *std::max_element(p, p + W + 1);
      T z = 0;
      for (int64_t n = 0; n <= W; ++n) z += p[n] = std::exp(p[n] - top);
      for (int64_t n = 0; n <= W; ++n) p[n] /= z;
      for (int64_t n = 0; n < W; ++n)
        if (ok[n]) axpy(p[n] * x.keep(row, n), vs + win[n] * dv, o, dv);
      axpy(p[W] * x.keep(row, W), vs + i * dv, o, dv);
    }
  });
}

// Accumulates into gr [B·H·L, d] and gv [B·H·L, dv] (zeroed). A query writes its own row and
// its keys' rows, all in its (b, h) slice: one slice per task, so no two threads share a row.
template <typename T>
void backward_rows(const Rows<T>& x, int64_t slices, const T* probs, const T* grad, T* gr, T* gv) {
  const int64_t W = x.W, d = x.d, dv = x.dv, L = x.L;
  at::parallel_for(0, slices, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> dl(W + 1);
    for (int64_t bh = begin; bh < end; ++bh) {
      const T* rs = x.r + bh * L * d;
      const T* vs = x.v + bh * L * dv;
      T* grs = gr + bh * L * d;
      T* gvs = gv + bh * L * dv;
      for (int64_t i = 0; i < L; ++i) {
        if (x.pad[(bh / x.H) * L + i]) continue;  // output 0: no gradient in or out
        const int64_t row = bh * L + i;
        const T* p = probs + row * (W + 1);
        const T* g = grad + row * dv;
        const int64_t* win = x.window + row * W;
        const bool* ok = x.valid + row * W;
        auto key = [&](int64_t n) { return n == W ? i : win[n]; };
        auto used = [&](int64_t n) { return n == W || ok[n]; };
        T sum = 0;
        for (int64_t n = 0; n <= W; ++n) {
          dl[n] = used(n) ? x.keep(row, n) * dot(g, vs + key(n) * dv, dv) : T(0);
          sum += p[n] * dl[n];
        }
        for (int64_t n = 0; n <= W; ++n) dl[n] = x.scale * p[n] * (dl[n] - sum);
        const T* ri = rs + i * d;
        T* gri = grs + i * d;
        for (int64_t n = 0; n < W; ++n) {
          if (!ok[n]) continue;
          const int64_t j = win[n];
          axpy(dl[n], rs + j * d, gri, d);
          axpy(dl[n], ri, grs + j * d, d);
          axpy(p[n] * x.keep(row, n), g, gvs + j * dv, dv);
        }
        axpy(2 * dl[W], ri, gri, d);
        axpy(p[W] * x.keep(row, W), g, gvs + i * dv, dv);
      }
    }
  });
}

template <typename T>
Rows<T> rows_of(const at::Tensor& r, const at::Tensor& v, const at::Tensor& window, const at::Tensor& valid,
                const at::Tensor& pad, const at::Tensor& mask, double scale) {
  return {r.size(1), r.size(2), window.size(3), r.size(3), v.size(3),
          r.data_ptr<T>(), v.data_ptr<T>(), window.data_ptr<int64_t>(), valid.data_ptr<bool>(),
          pad.data_ptr<bool>(), mask.defined() ? mask.data_ptr<T>() : nullptr, static_cast<T>(scale)};
}

#if SEQREC_HAVE_CUDA
// The same two passes on a CUDA device: routing_attention.cu's kernels, one warp per query.
template <typename T>
cuda::routing_kernel::Args<T> kernel_args(const at::Tensor& r, const at::Tensor& v, const at::Tensor& window,
                                          const at::Tensor& valid, const at::Tensor& pad, const at::Tensor& mask,
                                          const at::Tensor& probs, double scale) {
  cuda::routing_kernel::Args<T> a{};
  a.r = r.data_ptr<T>();
  a.v = v.data_ptr<T>();
  a.window = window.data_ptr<int64_t>();
  a.valid = valid.data_ptr<bool>();
  a.pad = pad.data_ptr<bool>();
  a.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
  a.probs = probs.data_ptr<T>();
  a.B = r.size(0);
  a.H = r.size(1);
  a.L = r.size(2);
  a.W = window.size(3);
  a.d = r.size(3);
  a.dv = v.size(3);
  a.scale = static_cast<T>(scale);
  return a;
}
#endif

// One autograd Function for both devices: the passes run on the inputs' device (the loops above
// on the CPU, the CUDA kernels on a GPU); the dropout mask is drawn the same way for both.
struct RoutedAttention : public torch::autograd::Function<RoutedAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& r_in, const at::Tensor& v_in,
                               const at::Tensor& window_in, const at::Tensor& valid_in, const at::Tensor& pad_in,
                               double scale, double dropout, bool use_mask) {
    auto r = r_in.contiguous(), v = v_in.contiguous();
    auto window = window_in.contiguous(), valid = valid_in.contiguous(), pad = pad_in.contiguous();
    const int64_t B = r.size(0), H = r.size(1), L = r.size(2), W = window.size(3);
    at::Tensor mask;
    if (use_mask) mask = dropout_mask(at::empty({B, H, L, W + 1}, r.options()), dropout, random_seed());
    auto out = at::empty({B, H, L, v.size(3)}, v.options());
    auto probs = at::empty({B, H, L, W + 1}, r.options());
    AT_DISPATCH_FLOATING_TYPES(r.scalar_type(), "routed_attention_forward", [&] {
#if SEQREC_HAVE_CUDA
      if (r.is_cuda()) {
        const CudaLaunch launch(r);
        auto a = kernel_args<scalar_t>(r, v, window, valid, pad, mask, probs, scale);
        a.out = out.data_ptr<scalar_t>();
        cuda::routed_attention_forward_launch<scalar_t>(a, launch.stream());
        return;
      }
#endif
      forward_rows(rows_of<scalar_t>(r, v, window, valid, pad, mask, scale), B * H * L, out.data_ptr<scalar_t>(),
                   probs.data_ptr<scalar_t>());
    });
    ctx->save_for_backward({r, v, window, valid, pad, probs, mask});
    ctx->saved_data["scale"] = scale;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // Grad mode is on here only under create_graph: the passes below build no graph.
    TORCH_CHECK(!at::GradMode::is_enabled(), "routed_attention does not support double backward");
    auto saved = ctx->get_saved_variables();
    const auto &r = saved[0], &v = saved[1], &window = saved[2], &valid = saved[3], &pad = saved[4],
               &probs = saved[5], &mask = saved[6];
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto grad = grad_out[0].contiguous();
    auto gr = at::zeros_like(r), gv = at::zeros_like(v);
    AT_DISPATCH_FLOATING_TYPES(r.scalar_type(), "routed_attention_backward", [&] {
#if SEQREC_HAVE_CUDA
      if (r.is_cuda()) {
        const CudaLaunch launch(r);
        auto dl = at::empty_like(probs);
        auto a = kernel_args<scalar_t>(r, v, window, valid, pad, mask, probs, scale);
        a.grad = grad.data_ptr<scalar_t>();
        a.gr = gr.data_ptr<scalar_t>();
        a.gv = gv.data_ptr<scalar_t>();
        a.dl = dl.data_ptr<scalar_t>();
        cuda::routed_attention_backward_launch<scalar_t>(a, launch.stream());
        return;
      }
#endif
      backward_rows(rows_of<scalar_t>(r, v, window, valid, pad, mask, scale), r.size(0) * r.size(1),
                    probs.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), gr.data_ptr<scalar_t>(),
                    gv.data_ptr<scalar_t>());
    });
    return {gr, gv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};


}  // namespace

at::Tensor routed_attention(const at::Tensor& r, const at::Tensor& v, const RoutingPlan& plan,
                            const at::Tensor& key_padding, double scale, double dropout, bool training) {
  const bool floating = r.scalar_type() == at::kFloat || r.scalar_type() == at::kDouble;
  bool kernel_device = r.device().is_cpu();
#if SEQREC_HAVE_CUDA
  kernel_device = kernel_device || r.is_cuda();
#endif
  if (!fused_kernels() || !kernel_device || !floating)
    return routed_attention_reference(r, v, plan, key_padding, scale, dropout, training);
  detail::check_routed_attention_args(r, v, plan, key_padding, dropout);
  return RoutedAttention::apply(r, v, plan.window, plan.valid, key_padding, scale, dropout,
                                training && dropout > 0)[0];
}

}  // namespace seqrec::ops
