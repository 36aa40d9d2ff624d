#pragma once
#include <string>

// Whether the ops run their fused kernels (the CPU's, and a CUDA device's where one exists) or
// their ATen references everywhere. On by default; `--fused_kernels=false` turns it off for a
// process, to check a model or time it through the references the kernels are tested against.
// Set once, before any op runs (it is read at every call, not synchronised with running ops).
namespace seqrec::ops {

void set_fused_kernels(bool on);
bool fused_kernels();

// How float32 matrix products run on CUDA devices (`--matmul_precision`): "highest" (float32
// throughout, the default) or "high" (TensorFloat-32 tensor cores for cuBLAS products and cuDNN
// convolutions: inputs rounded to 10-bit mantissas, float32 accumulation). Sets ATen's global
// context for the process; the CPU's products are float32 either way. Throws
// std::invalid_argument naming an unknown value.
void set_matmul_precision(const std::string& name);
std::string matmul_precision();

}  // namespace seqrec::ops
