#pragma once
// Helpers shared by the op tests: padding masks and a gradient check against central
// differences (double inputs, scalar objective).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/kernels.h"

namespace seqrec::testing {

// Sets the fused-kernels switch for a scope and restores it however the scope ends.
struct ScopedFusedKernels {
  explicit ScopedFusedKernels(bool on) : before(ops::fused_kernels()) { ops::set_fused_kernels(on); }
  ~ScopedFusedKernels() { ops::set_fused_kernels(before); }
  ScopedFusedKernels(const ScopedFusedKernels&) = delete;
  ScopedFusedKernels& operator=(const ScopedFusedKernels&) = delete;
  bool before;
};

// [B, L] bool, true at padded slots: the first L - len slots of each row (left padding) or the
// last ones (right padding).
inline at::Tensor padding_mask(const std::vector<int64_t>& lengths, int64_t L, bool left = true) {
  auto pad = torch::ones({static_cast<int64_t>(lengths.size()), L}, torch::kBool);
  for (size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] > 0) pad[b].narrow(0, left ? L - lengths[b] : 0, lengths[b]).fill_(false);
  return pad;
}

// Autograd's gradient of f() w.r.t. each input (double, requires_grad) against central
// differences at every `stride`-th element.
inline void expect_gradients_match_central_differences(const std::function<at::Tensor()>& f,
                                                       const std::vector<at::Tensor>& inputs,
                                                       int64_t stride = 3, double tol = 1e-6) {
  auto grads = torch::autograd::grad({f()}, inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto flat = inputs[i].detach().view(-1);
    auto g = grads[i].reshape(-1);
    ASSERT_TRUE(torch::isfinite(g).all().item<bool>()) << "input " << i;
    for (int64_t j = 0; j < flat.numel(); j += stride) {
      const double h = 1e-6, keep = flat[j].item<double>();
      torch::NoGradGuard no_grad;
      flat[j] = keep + h;
      const double up = f().item<double>();
      flat[j] = keep - h;
      const double down = f().item<double>();
      flat[j] = keep;
      EXPECT_NEAR(g[j].item<double>(), (up - down) / (2 * h), tol) << "input " << i << " index " << j;
    }
  }
}

// Largest absolute difference, compared in double (so a float result can meet a double
// reference); 0 for empty tensors.
inline double max_err(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Runs f and expects it to throw (c10::Error or any std::exception) with `what` in the message.
template <class F>
void expect_error(F f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << what << "'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace seqrec::testing
