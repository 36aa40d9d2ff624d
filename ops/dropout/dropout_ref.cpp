#include "ops/dropout/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace seqrec::ops {

uint64_t random_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

at::Tensor dropout_reference(const at::Tensor& x, double p, uint64_t seed) { return x * dropout_mask(x, p, seed); }

at::Tensor activation_dropout_reference(const at::Tensor& a, Activation act, double p, bool training) {
  return ops::dropout(act == Activation::kGelu ? torch::gelu(a) : torch::relu(a), p, training);
}

at::Tensor bias_activation_dropout_reference(const at::Tensor& y, const at::Tensor& bias,
                                             std::optional<Activation> act, double p, bool training,
                                             at::ScalarType out) {
  auto a = y.to(at::kFloat) + bias;
  return (act ? activation_dropout(a, *act, p, training) : ops::dropout(a, p, training)).to(out);
}

at::Tensor softmax_dropout_bf16_reference(const at::Tensor& scores, const at::Tensor& bias, double scale, double p,
                                          bool training) {
  auto x = scores.to(at::kFloat).mul_(scale).add_(bias);
  return ops::dropout(torch::softmax(x, -1), p, training).to(at::kBFloat16);
}

}  // namespace seqrec::ops
