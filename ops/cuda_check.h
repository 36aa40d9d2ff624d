#pragma once
// The CUDA runtime's errors as exceptions, one family for every .cu: the op, what failed (the
// call as written), the runtime's message and where. nvcc only (it includes the runtime).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace seqrec::ops::cuda {

inline void check_cuda(cudaError_t err, const char* op, const char* what, const char* file, int line) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(op) + " (CUDA): " + what + ": " + cudaGetErrorString(err) + " (" + file +
                             ":" + std::to_string(line) + ")");
}

}  // namespace seqrec::ops::cuda

// SEQREC_CUDA_CHECK("LISA attention", cudaGetLastError()) throws std::runtime_error on failure.
#define SEQREC_CUDA_CHECK(op, expr) ::seqrec::ops::cuda::check_cuda((expr), (op), #expr, __FILE__, __LINE__)
