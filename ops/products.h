#pragma once
#include <ATen/core/Tensor.h>

// The matrix products of the models' layers, attention and loss, in the precision that
// `--matmul_precision` names (ops/kernels.h). At "highest" and "high" each is the ATen product
// it names. At "medium" a float32 product takes bfloat16 copies of its operands and returns
// float32: the product accumulates in float32 and its result is rounded to bfloat16's 8-bit
// mantissa once (about 4e-3 relative), on any device. On a CPU with AVX-512 BF16 oneDNN runs
// those products on the BF16 dot-product instructions, two to three times float32's rate;
// elsewhere it emulates them. Gradients flow through the casts, so a backward's products run in
// bfloat16 too and every gradient arrives in float32. Products of other dtypes are untouched.
namespace seqrec::ops {

// Whether a product of the float32 tensor `t` runs on bfloat16 operands: the precision is
// "medium" and `t` is float32.
bool bf16_products(const at::Tensor& t);

// x·weightᵀ + bias, as at::linear (bias may be undefined). A bfloat16 x beside a float32 weight
// (an op's output already rounded for this product) takes the bfloat16 product at any precision
// and returns float32.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// x·weightᵀ on bfloat16 operands, returned in bfloat16 without a bias: for a layer whose bias,
// activation and dropout run as one epilogue (ops::bias_activation_dropout) where
// bf16_products(x) holds, or x is already bfloat16.
at::Tensor product_bf16(const at::Tensor& x, const at::Tensor& weight);

// a·b with at::matmul's broadcasting.
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);

// For hand-written backwards (no autograd): out = a·b, and self += a·b, all 2-D.
void mm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);
void addmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b);

// `b` as the products above take it beside a float32 `a`: its bfloat16 copy where they run on
// bfloat16 operands, else `b` itself. An operand reused across many products (a loss's item
// table, chunk after chunk) is cast once this way; the first operand decides the precision.
at::Tensor product_operand(const at::Tensor& b);

}  // namespace seqrec::ops
