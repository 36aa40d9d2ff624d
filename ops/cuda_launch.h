#pragma once
// The host side of an op's CUDA launch, shared by the ops' *_fused.cpp (include it under
// SEQREC_HAVE_CUDA only): for as long as it lives, the device of the tensor it was made from is
// current, and stream() is that device's current stream as the void* every launcher of the ops'
// *_cuda.h takes (a cudaStream_t; the launchers' headers stay free of Torch so that nvcc never
// parses it).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace seqrec::ops {

class CudaLaunch {
 public:
  explicit CudaLaunch(const at::Tensor& on)
      : guard_(on.device()), stream_(c10::cuda::getCurrentCUDAStream(on.device().index()).stream()) {}
  CudaLaunch(const CudaLaunch&) = delete;
  CudaLaunch& operator=(const CudaLaunch&) = delete;

  void* stream() const { return stream_; }

 private:
  c10::cuda::CUDAGuard guard_;
  void* stream_;
};

}  // namespace seqrec::ops
