#pragma once
#include <string>

// Whether the ops run their fused kernels (the CPU's, and a CUDA device's where one exists) or
// their ATen references everywhere. On by default; `--fused_kernels=false` turns it off for a
// process, to check a model or time it through the references the kernels are tested against.
// Set once, before any op runs (it is read at every call, not synchronised with running ops).
namespace seqrec::ops {

void set_fused_kernels(bool on);
bool fused_kernels();

// How float32 matrix products run (`--matmul_precision`):
// - "highest": float32 throughout, the default;
// - "high": on CUDA devices, TensorFloat-32 tensor cores for cuBLAS products and cuDNN
//   convolutions (inputs rounded to 10-bit mantissas, float32 accumulation); a CPU's products
//   stay float32;
// - "medium": on any device, the products of the models' layers, attention and loss run on
//   bfloat16 operands (ops/products.h), and other float32 cuBLAS products as at "high" (LibTorch
//   2.x may also hand other float32 CPU products to oneDNN in bfloat16 on a CPU with AVX-512 BF16).
// Sets ATen's global context for the process. Throws std::invalid_argument naming an unknown
// value.
void set_matmul_precision(const std::string& name);
std::string matmul_precision();

// Whether this CPU has AVX-512 BF16 (bfloat16 dot products), which "medium" needs to be fast on
// a CPU.
bool cpu_has_bf16_dot();

}  // namespace seqrec::ops
