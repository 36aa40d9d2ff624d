#include "ops/products.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

namespace seqrec::ops {
namespace {

at::Tensor bf16(const at::Tensor& t) { return t.to(at::kBFloat16); }

}  // namespace

bool bf16_products(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat &&
         at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::MEDIUM;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!bf16_products(x)) return at::linear(x, weight, bias);
  auto y = at::linear(bf16(x), bf16(weight));
  // bfloat16 + float32 promotes to float32: the bias is added in the pass that widens the result.
  return bias.defined() ? at::add(y, bias) : y.to(at::kFloat);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!bf16_products(a)) return at::matmul(a, b);
  return at::matmul(bf16(a), bf16(b)).to(at::kFloat);
}

void mm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (!bf16_products(a)) {
    at::mm_out(out, a, b);
    return;
  }
  out.copy_(at::mm(bf16(a), bf16(b)));
}

void addmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b) {
  if (!bf16_products(a)) {
    self.addmm_(a, b);
    return;
  }
  self.add_(at::mm(bf16(a), bf16(b)));
}

at::Tensor product_operand(const at::Tensor& b) { return bf16_products(b) ? bf16(b) : b; }

}  // namespace seqrec::ops
