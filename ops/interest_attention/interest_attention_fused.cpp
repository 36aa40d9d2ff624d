// causal_interest_attention (interest_attention.h): the slot-by-slot scan of
// interest_attention_kernel.h behind an autograd function. On a CUDA device interest_attention.cu's
// kernels walk one row per (sequence, head), a warp each. On the CPU the same arithmetic walks
// rows in groups of one vector's width, the row innermost in every array (interest_groups_cpu.h),
// so that each of the walk's steps is one vector operation over the group's rows; groups spread
// over the threads.
//
// Until 2026-11-28 the CPU ran its own kernel, a checkpointed scan over chunks of slots in GEMMs
// and ATen ops with autograd recomputation; the row walk drew level with it per op and trained
// LightSANs 6-20% faster per epoch. Until 2026-12-04 the CPU ran the CUDA kernel's row functions
// on a one-lane warp, whose loops over one head's dims are too short to fill a vector; the groups'
// layout replaced it (docs/benchmarks.md, "LightSANs' interest scan in groups of rows").
#include "ops/interest_attention/interest_attention.h"

#include "ops/dropout/dropout.h"
#include "ops/kernels.h"
#include "ops/op_checks.h"
#include "ops/interest_attention/interest_groups_cpu.h"
#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include "ops/cuda_launch.h"
#include "ops/interest_attention/interest_attention_kernel.h"
#include "ops/interest_attention/interest_attention_cuda.h"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace seqrec::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor make_mask(const at::Tensor& q, int64_t K, double p, uint64_t seed) {
  // Shaped like the reference's attention probabilities [B, H, L, k], so given the same
  // generator state the mask equals the one interest_attention draws.
  return dropout_mask(at::empty({q.size(0), q.size(1), q.size(2), K}, q.options()), p, seed);
}

// What the forward keeps for the backward, on either device: every slot's running maxima,
// normalisers and scores, and the state entering each chunk of C slots. C only trades the
// checkpoints (L / C states) against the backward's scratch (C slots' aggregates), so it is
// about sqrt(L) unless the caller names one.
int64_t scan_chunk(int64_t chunk, int64_t L) {
  const int64_t C = chunk > 0 ? chunk : std::llround(std::sqrt(static_cast<double>(L)));
  return std::clamp<int64_t>(C, 1, std::max<int64_t>(L, 1));
}

#if SEQREC_HAVE_CUDA
// The tensors of one call: q [B, H, L, Dh], k and v [B, L, D], a [B, L, 2k], pad [B, L] and
// mask [B, H, L, k] (or undefined), contiguous, on one device; m, z [B·H, L, 2k] and
// s [B·H, L, k] filled by the forward; ckpt [B·H, ceil(L / C), 2k, Dh] or undefined.
struct ScanCall {
  at::Tensor q, k, v, a, pad, mask, m, z, s, ckpt;
  int64_t K, C;

  // What the backward needs, saved by the autograd function and restored from it.
  std::vector<at::Tensor> tensors() const { return {q, k, v, a, pad, mask, m, z, s, ckpt}; }
  std::vector<int64_t> sizes() const { return {K, C}; }
  static ScanCall restore(const std::vector<at::Tensor>& t, const std::vector<int64_t>& n) {
    return {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], n[0], n[1]};
  }

  template <typename T>
  cuda::interest_kernel::Args<T> args() const {
    cuda::interest_kernel::Args<T> r{};
    r.q = q.data_ptr<T>();
    r.k = k.data_ptr<T>();
    r.v = v.data_ptr<T>();
    r.a = a.data_ptr<T>();
    r.pad = pad.data_ptr<bool>();
    r.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
    r.m = m.data_ptr<T>();
    r.z = z.data_ptr<T>();
    r.s = s.data_ptr<T>();
    r.ckpt = ckpt.defined() ? ckpt.data_ptr<T>() : nullptr;
    r.B = q.size(0);
    r.H = q.size(1);
    r.L = q.size(2);
    r.Dh = q.size(3);
    r.K = K;
    r.C = C;
    r.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    return r;
  }
};

// Runs the forward (backward = false) or backward rows of `a` on `like`'s CUDA device.
template <typename T>
void run_rows(const cuda::interest_kernel::Args<T>& a, bool backward, const at::Tensor& like) {
  const CudaLaunch launch(like);
  if (backward)
    cuda::interest_attention_backward_launch<T>(a, launch.stream());
  else
    cuda::interest_attention_forward_launch<T>(a, launch.stream());
}

// The forward: the output, with call.m, call.z, call.s (and call.ckpt when defined) filled.
at::Tensor run_scan_forward(const ScanCall& call) {
  const int64_t B = call.q.size(0), H = call.q.size(1), L = call.q.size(2), Dh = call.q.size(3);
  auto out = at::empty({B, H, L, Dh}, call.q.options());
  auto state = at::empty({B * H, 2 * call.K, Dh}, call.q.options());
  auto slot = at::empty({B * H, 7 * call.K}, call.q.options());
  AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "causal_interest_scan", [&] {
    auto a = call.args<scalar_t>();
    a.out = out.data_ptr<scalar_t>();
    a.state = state.data_ptr<scalar_t>();
    a.slot = slot.data_ptr<scalar_t>();
    run_rows<scalar_t>(a, /*backward=*/false, call.q);
  });
  return out;
}

ScanCall scan_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logits_k,
                   const at::Tensor& logits_v, const at::Tensor& pad, const at::Tensor& mask, int64_t chunk,
                   bool keep_checkpoints) {
  ScanCall c;
  c.q = q.contiguous();
  c.k = k.contiguous();
  c.v = v.contiguous();
  c.a = torch::cat({logits_k, logits_v}, 2).contiguous();
  c.pad = pad.contiguous();
  c.mask = mask.defined() ? mask.contiguous() : at::Tensor();
  c.K = logits_k.size(2);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  c.C = scan_chunk(chunk, L);
  c.m = at::empty({B * H, L, 2 * c.K}, q.options());
  c.z = at::empty({B * H, L, 2 * c.K}, q.options());
  c.s = at::empty({B * H, L, c.K}, q.options());
  if (keep_checkpoints) c.ckpt = at::empty({B * H, (L + c.C - 1) / c.C, 2 * c.K, Dh}, q.options());
  return c;
}

// The backward: gq, gk, gv and the logits' gradient summed over the heads [B, L, 2k].
std::array<at::Tensor, 4> run_scan_backward(const ScanCall& call, const at::Tensor& grad_out) {
  const int64_t B = call.q.size(0), H = call.q.size(1), L = call.q.size(2), Dh = call.q.size(3), K = call.K;
  const auto grad = grad_out.contiguous();
  auto gq = at::empty_like(call.q), gk = at::empty_like(call.k), gv = at::empty_like(call.v);
  auto ga = at::empty({B * H, L, 2 * K}, call.q.options());
  auto o = call.q.options();
  auto state = at::empty({B * H, 2 * K, Dh}, o), agg = at::empty({B * H, call.C, 2 * K, Dh}, o);
  auto carry = at::empty({B * H, 2 * K, Dh}, o), carry_c = at::empty({B * H, 2, 2 * K}, o);
  auto slot = at::empty({B * H, 7 * K}, o);
  AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "causal_interest_scan_backward", [&] {
    auto a = call.args<scalar_t>();
    a.state = state.data_ptr<scalar_t>();
    a.grad = grad.data_ptr<scalar_t>();
    a.gq = gq.data_ptr<scalar_t>();
    a.gk = gk.data_ptr<scalar_t>();
    a.gv = gv.data_ptr<scalar_t>();
    a.ga = ga.data_ptr<scalar_t>();
    a.agg = agg.data_ptr<scalar_t>();
    a.carry = carry.data_ptr<scalar_t>();
    a.carry_c = carry_c.data_ptr<scalar_t>();
    a.slot = slot.data_ptr<scalar_t>();
    run_rows<scalar_t>(a, /*backward=*/true, call.q);
  });
  // Each warp wrote its head's share of the logits' gradient.
  return {gq, gk, gv, ga.view({B, H, L, 2 * K}).sum(1)};
}

// The CUDA device's scan, for CausalInterestScan.
struct RowScan {
  using Call = ScanCall;
  static Call call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logits_k,
                   const at::Tensor& logits_v, const at::Tensor& pad, const at::Tensor& mask, int64_t chunk,
                   bool keep_checkpoints) {
    return scan_call(q, k, v, logits_k, logits_v, pad, mask, chunk, keep_checkpoints);
  }
  static at::Tensor forward(const Call& c) { return run_scan_forward(c); }
  static std::array<at::Tensor, 4> backward(const Call& c, const at::Tensor& grad) { return run_scan_backward(c, grad); }
};

#endif  // SEQREC_HAVE_CUDA

// ---- the CPU: rows in groups (interest_groups_cpu.h) ----

namespace groups = interest_groups;

// [N, rest...] -> [G, rest..., R]: rows in groups of R, the row innermost; rows past N (the
// last group's remainder) filled with `fill`.
at::Tensor to_groups(const at::Tensor& rows, int64_t G, int64_t R, double fill) {
  const int64_t N = rows.size(0);
  at::Tensor all = rows;
  if (G * R > N) {
    auto extra = rows.sizes().vec();
    extra[0] = G * R - N;
    all = at::cat({rows, at::full(extra, fill, rows.options())}, 0);
  }
  auto sizes = all.sizes().vec();
  sizes[0] = R;
  sizes.insert(sizes.begin(), G);  // [G, R, rest...]
  std::vector<int64_t> perm{0};
  for (int64_t d = 2; d < static_cast<int64_t>(sizes.size()); ++d) perm.push_back(d);
  perm.push_back(1);
  return all.reshape(sizes).permute(perm).contiguous();
}

// [G, rest..., R] -> [N, rest...], the inverse of to_groups (the remainder's rows dropped).
at::Tensor from_groups(const at::Tensor& grouped, int64_t N) {
  const int64_t n = grouped.dim();
  std::vector<int64_t> perm{0, n - 1};
  for (int64_t d = 1; d < n - 1; ++d) perm.push_back(d);
  auto rows = grouped.permute(perm);  // [G, R, rest...]
  auto sizes = rows.sizes().vec();
  sizes[1] *= sizes[0];
  sizes.erase(sizes.begin());
  return rows.reshape(sizes).narrow(0, 0, N);
}

// k or v [B, L, H·Dh] -> [B·H, L, Dh], row b·H + h the head's dims; and back.
at::Tensor head_rows(const at::Tensor& x, int64_t H) {
  const int64_t B = x.size(0), L = x.size(1), Dh = x.size(2) / H;
  return x.reshape({B, L, H, Dh}).permute({0, 2, 1, 3}).reshape({B * H, L, Dh});
}
at::Tensor from_head_rows(const at::Tensor& rows, int64_t B, int64_t H) {
  const int64_t L = rows.size(1), Dh = rows.size(2);
  return rows.reshape({B, H, L, Dh}).permute({0, 2, 1, 3}).reshape({B, L, H * Dh});
}

// The tensors of one call in the group layout (groups::Args): q, k, v [G, L, Dh, R], the logits
// a [G, L, 2k, R] (each head's row a copy of its sequence's), real [G, L, R] (1 at a real slot),
// mask [G, L, k, R] or undefined; m, z [G, L, 2k, R] and s [G, L, k, R] filled by the forward;
// ckpt [G, ceil(L / C), 2k, Dh, R] or undefined.
struct GroupCall {
  at::Tensor q, k, v, a, real, mask, m, z, s, ckpt;
  int64_t B, H, K, C;

  // What the backward needs, saved by the autograd function and restored from it.
  std::vector<at::Tensor> tensors() const { return {q, k, v, a, real, mask, m, z, s, ckpt}; }
  std::vector<int64_t> sizes() const { return {B, H, K, C}; }
  static GroupCall restore(const std::vector<at::Tensor>& t, const std::vector<int64_t>& n) {
    return {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], n[0], n[1], n[2], n[3]};
  }

  template <typename T>
  groups::Args<T> args() const {
    groups::Args<T> r{};
    r.q = q.data_ptr<T>();
    r.k = k.data_ptr<T>();
    r.v = v.data_ptr<T>();
    r.a = a.data_ptr<T>();
    r.real = real.data_ptr<T>();
    r.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
    r.m = m.data_ptr<T>();
    r.z = z.data_ptr<T>();
    r.s = s.data_ptr<T>();
    r.ckpt = ckpt.defined() ? ckpt.data_ptr<T>() : nullptr;
    r.G = q.size(0);
    r.L = q.size(1);
    r.Dh = q.size(2);
    r.K = K;
    r.C = C;
    r.R = q.size(3);
    r.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.size(2))));
    return r;
  }
};

GroupCall group_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logits_k,
                     const at::Tensor& logits_v, const at::Tensor& pad, const at::Tensor& mask, int64_t chunk,
                     bool keep_checkpoints) {
  GroupCall c;
  c.B = q.size(0);
  c.H = q.size(1);
  c.K = logits_k.size(2);
  const int64_t B = c.B, H = c.H, L = q.size(2), Dh = q.size(3), K = c.K, BH = B * H;
  // Rows per group: one vector of the CPU level the group functions run at.
  const int64_t R =
      q.scalar_type() == at::kFloat ? groups::rows_per_group<float>(BH) : groups::rows_per_group<double>(BH);
  const int64_t G = (BH + R - 1) / R;
  c.C = scan_chunk(chunk, L);
  c.q = to_groups(q.reshape({BH, L, Dh}), G, R, 0);
  c.k = to_groups(head_rows(k, H), G, R, 0);
  c.v = to_groups(head_rows(v, H), G, R, 0);
  c.a = to_groups(torch::cat({logits_k, logits_v}, 2).unsqueeze(1).expand({B, H, L, 2 * K}).reshape({BH, L, 2 * K}),
                  G, R, 0);
  c.real = to_groups(pad.logical_not().to(q.scalar_type()).unsqueeze(1).expand({B, H, L}).reshape({BH, L}), G, R, 0);
  if (mask.defined()) c.mask = to_groups(mask.reshape({BH, L, K}), G, R, 1);
  const auto o = q.options();
  c.m = at::empty({G, L, 2 * K, R}, o);
  c.z = at::empty({G, L, 2 * K, R}, o);
  c.s = at::empty({G, L, K, R}, o);
  if (keep_checkpoints) c.ckpt = at::empty({G, (L + c.C - 1) / c.C, 2 * K, Dh, R}, o);
  return c;
}

// The forward: the output [B, H, L, Dh], with call.m, call.z, call.s (and call.ckpt when
// defined) filled.
at::Tensor run_groups_forward(const GroupCall& call) {
  const int64_t G = call.q.size(0), L = call.q.size(1), Dh = call.q.size(2);
  auto out = at::empty({G, L, Dh, call.q.size(3)}, call.q.options());
  AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "causal_interest_groups", [&] {
    auto a = call.args<scalar_t>();
    a.out = out.data_ptr<scalar_t>();
    at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) groups::run_group<scalar_t>(a, g, /*backward=*/false);
    });
  });
  return from_groups(out, call.B * call.H).reshape({call.B, call.H, L, Dh});
}

// The backward: gq, gk, gv and the logits' gradient summed over the heads [B, L, 2k].
std::array<at::Tensor, 4> run_groups_backward(const GroupCall& call, const at::Tensor& grad_out) {
  const int64_t B = call.B, H = call.H, K = call.K, BH = B * H;
  const int64_t G = call.q.size(0), L = call.q.size(1), Dh = call.q.size(2), R = call.q.size(3);
  const auto grad = to_groups(grad_out.reshape({BH, L, Dh}), G, R, 0);
  const auto o = call.q.options();
  auto gq = at::empty({G, L, Dh, R}, o), gk = at::empty({G, L, Dh, R}, o), gv = at::empty({G, L, Dh, R}, o);
  auto ga = at::empty({G, L, 2 * K, R}, o);
  AT_DISPATCH_FLOATING_TYPES(call.q.scalar_type(), "causal_interest_groups_backward", [&] {
    auto a = call.args<scalar_t>();
    a.grad = grad.data_ptr<scalar_t>();
    a.gq = gq.data_ptr<scalar_t>();
    a.gk = gk.data_ptr<scalar_t>();
    a.gv = gv.data_ptr<scalar_t>();
    a.ga = ga.data_ptr<scalar_t>();
    at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) groups::run_group<scalar_t>(a, g, /*backward=*/true);
    });
  });
  // Each row wrote its head's share of the logits' gradient.
  return {from_groups(gq, BH).reshape({B, H, L, Dh}), from_head_rows(from_groups(gk, BH), B, H),
          from_head_rows(from_groups(gv, BH), B, H), from_groups(ga, BH).reshape({B, H, L, 2 * K}).sum(1)};
}

// The CPU's scan, for CausalInterestScan.
struct GroupScan {
  using Call = GroupCall;
  static Call call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logits_k,
                   const at::Tensor& logits_v, const at::Tensor& pad, const at::Tensor& mask, int64_t chunk,
                   bool keep_checkpoints) {
    return group_call(q, k, v, logits_k, logits_v, pad, mask, chunk, keep_checkpoints);
  }
  static at::Tensor forward(const Call& c) { return run_groups_forward(c); }
  static std::array<at::Tensor, 4> backward(const Call& c, const at::Tensor& grad) {
    return run_groups_backward(c, grad);
  }
};

// The op's autograd function over one device's scan (RowScan on a CUDA device, GroupScan on the
// CPU): the mask drawn, the forward run with its checkpoints kept, and what the backward needs
// saved.
template <class Scan>
struct CausalInterestScan : public torch::autograd::Function<CausalInterestScan<Scan>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& pad,
                               double dropout, bool use_mask, int64_t chunk) {
    at::Tensor mask;  // drawn here: an undefined tensor cannot be an input of an autograd Function
    if (use_mask) mask = make_mask(q, logits_k.size(2), dropout, random_seed());
    auto call = Scan::call(q, k, v, logits_k, logits_v, pad, mask, chunk, /*keep_checkpoints=*/true);
    auto out = Scan::forward(call);
    ctx->save_for_backward(call.tensors());
    ctx->saved_data["sizes"] = call.sizes();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // Grad mode is on here only under create_graph: the kernels build no graph.
    TORCH_CHECK(!at::GradMode::is_enabled(), "causal_interest_attention does not support double backward");
    const auto call = Scan::Call::restore(ctx->get_saved_variables(), ctx->saved_data["sizes"].toIntVector());
    auto [gq, gk, gv, ga] = Scan::backward(call, grad_out[0]);
    const int64_t K = call.K;
    at::Tensor gak, gav;
    if (ctx->needs_input_grad(3)) gak = ga.narrow(2, 0, K);
    if (ctx->needs_input_grad(4)) gav = ga.narrow(2, K, K);
    return {gq, gk, gv, gak, gav, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The op through the scan (float, double) on its device, with the dropout mask drawn as the
// reference draws it (make_mask), so that one generator state drops the same probabilities
// either way.
at::Tensor scan_causal_interest_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& pad,
                                          double dropout, bool use_mask, bool needs_grad, int64_t chunk) {
  auto run = [&](auto scan) -> at::Tensor {
    using Scan = decltype(scan);
    if (needs_grad) return CausalInterestScan<Scan>::apply(q, k, v, logits_k, logits_v, pad, dropout, use_mask, chunk)[0];
    torch::NoGradGuard no_grad;
    at::Tensor mask;
    if (use_mask) mask = make_mask(q, logits_k.size(2), dropout, random_seed());
    return Scan::forward(Scan::call(q, k, v, logits_k, logits_v, pad, mask, chunk, /*keep_checkpoints=*/false));
  };
  if (q.device().is_cpu()) return run(GroupScan{});
#if SEQREC_HAVE_CUDA
  return run(RowScan{});
#else
  TORCH_CHECK(false, "causal_interest_attention's scan: no kernel for device ", q.device());
#endif
}

// The arguments of causal_interest_attention, checked at the boundary.
void check_causal_interest_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& logits_k, const at::Tensor& logits_v, const at::Tensor& key_padding,
                                double dropout, int64_t chunk) {
  TORCH_CHECK(q.dim() == 4, "q must be [B, H, L, Dh], got ", q.sizes());
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  TORCH_CHECK(k.dim() == 3 && k.size(0) == B && k.size(1) == L && k.size(2) == H * Dh,
              "k must be [B, L, H*Dh] = [", B, ", ", L, ", ", H * Dh, "]; got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "v must match k ", k.sizes(), "; got ", v.sizes());
  TORCH_CHECK(logits_k.dim() == 3 && logits_k.size(0) == B && logits_k.size(1) == L && logits_k.size(2) >= 1,
              "logits_k must be [B, L, k] with k >= 1 matching q ", q.sizes(), "; got ", logits_k.sizes());
  TORCH_CHECK(logits_v.sizes() == logits_k.sizes(), "logits_v must match logits_k ", logits_k.sizes(),
              "; got ", logits_v.sizes());
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.scalar_type() == at::kBool && key_padding.size(0) == B &&
                  key_padding.size(1) == L,
              "key_padding must be bool [B, L] = [", B, ", ", L, "]; got ", key_padding.sizes());
  TORCH_CHECK(chunk >= 0, "chunk must be >= 0 (0 = automatic), got ", chunk);
  TORCH_CHECK(dropout >= 0 && dropout < 1, "dropout probability must be in [0, 1), got ", dropout);
  for (const auto* t : {&k, &v, &logits_k, &logits_v})
    TORCH_CHECK(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                "q, k, v, logits_k and logits_v must share dtype and device");
  TORCH_CHECK(key_padding.device() == q.device(), "key_padding must be on q's device ", q.device(), "; got ",
              key_padding.device());
}

}  // namespace

at::Tensor causal_interest_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& logits_k, const at::Tensor& logits_v,
                                     const at::Tensor& key_padding, double dropout, bool training, int64_t chunk) {
  check_causal_interest_args(q, k, v, logits_k, logits_v, key_padding, dropout, chunk);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  if (L == 0) return torch::zeros({B, H, 0, Dh}, q.options());
  bool kernel_device = q.device().is_cpu();
#if SEQREC_HAVE_CUDA
  kernel_device = kernel_device || q.is_cuda();
#endif
  if (!fused_kernels() || !kernel_device || (q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble))
    return interest_attention(q, causal_interest_aggregation(k, logits_k, key_padding),
                              causal_interest_aggregation(v, logits_v, key_padding), dropout, training);
  return scan_causal_interest_attention(q, k, v, logits_k, logits_v, key_padding, dropout, training && dropout > 0,
                                        detail::grad_wanted({q, k, v, logits_k, logits_v}), chunk);
}

}  // namespace seqrec::ops
