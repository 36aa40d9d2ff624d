#pragma once
// The CUDA runtime's errors as exceptions, one family for every .cu: the op, what failed (the
// call as written), the runtime's message and where; and the grid of a warp-per-row kernel,
// refused by name past the grid's limit. nvcc only (it includes the runtime).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda {

inline void check_cuda(cudaError_t err, const char* op, const char* what, const char* file, int line) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(op) + " (CUDA): " + what + ": " + cudaGetErrorString(err) + " (" + file +
                             ":" + std::to_string(line) + ")");
}

// Blocks of kRowWarps rows for `rows` rows (what each row is: `what`, for the message).
inline unsigned row_blocks(int64_t rows, const char* op, const char* what) {
  const int64_t blocks = (rows + kRowWarps - 1) / kRowWarps;
  if (blocks > 0x7fffffff)
    throw std::invalid_argument(std::string(op) + " (CUDA): " + std::to_string(rows) + " " + what +
                                " is beyond the kernel's grid");
  return static_cast<unsigned>(blocks);
}

}  // namespace seqrec::ops::cuda

// SEQREC_CUDA_CHECK("LISA attention", cudaGetLastError()) throws std::runtime_error on failure.
#define SEQREC_CUDA_CHECK(op, expr) ::seqrec::ops::cuda::check_cuda((expr), (op), #expr, __FILE__, __LINE__)
