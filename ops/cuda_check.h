#pragma once
// The CUDA runtime's errors as exceptions, one family for every .cu: the op, what failed (the
// call as written), the runtime's message and where; and the device's multiprocessor count,
// cached. nvcc only (it includes the runtime).
#include <cuda_runtime.h>

#include <atomic>
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

// The current device's multiprocessor count, asked once per device (what plans segments).
inline int multiprocessors(const char* op) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // 0: not yet asked
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), op, "cudaGetDevice", __FILE__, __LINE__);
  if (device >= 0 && device < kDevices) sms = known[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op,
               "cudaDeviceGetAttribute(multiprocessors)", __FILE__, __LINE__);
    if (device >= 0 && device < kDevices) known[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace seqrec::ops::cuda

// SEQREC_CUDA_CHECK("LISA attention", cudaGetLastError()) throws std::runtime_error on failure.
#define SEQREC_CUDA_CHECK(op, expr) ::seqrec::ops::cuda::check_cuda((expr), (op), #expr, __FILE__, __LINE__)
