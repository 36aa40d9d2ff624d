// LISA's histogram attention on a CUDA device (see lisa_attention_cuda.h): the kernels run the
// row functions of lisa_attention_kernel.h, which describes the algorithm, one warp per
// (sequence, codebook) row and kRowWarps rows per block.
//
// Time O(L · W) per row, registers O(W / 32) per lane, no shared memory; what the backward needs
// is A and r, kept by the forward.
#include "ops/lisa_attention/lisa_attention_cuda.h"

#include <stdexcept>
#include <string>

#include "ops/cuda_check.h"

namespace seqrec::ops::cuda {
namespace {

namespace lk = lisa_kernel;

template <typename T, int kPer, bool kBackward>
__global__ void __launch_bounds__(kRowThreads) lisa_kernel_rows(lk::Args<T> a) {
  const int64_t row = warp_row();
  if (row >= a.B * a.C) return;  // the whole warp leaves together
  DeviceWarp<lk::Lane<T, kPer>> warp;
  warp.lane = warp_lane();
  if (kBackward)
    lk::backward_row<T, kPer>(warp, a, row);
  else
    lk::forward_row<T, kPer>(warp, a, row);
}

template <typename T, bool kBackward>
void launch(const lk::Args<T>& a, void* stream_ptr) {
  if (a.W <= 0 || a.W > kLisaMaxCodewords)
    throw std::invalid_argument("LISA attention (CUDA): codewords per codebook must be in 1.." +
                                std::to_string(kLisaMaxCodewords) + ", got " + std::to_string(a.W));
  const int64_t rows = a.B * a.C;
  if (rows == 0 || a.L == 0) return;
  const unsigned blocks = row_blocks(rows, "LISA attention", "(sequence, codebook) rows");
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  lk::with_per_lane(a.W, [&](auto per) {
    lisa_kernel_rows<T, decltype(per)::value, kBackward><<<blocks, kRowThreads, 0, stream>>>(a);
    SEQREC_CUDA_CHECK("LISA attention", cudaGetLastError());
  });
}

}  // namespace

template <typename T>
void lisa_attention_forward_launch(const lk::Args<T>& a, void* stream) {
  launch<T, false>(a, stream);
}
template <typename T>
void lisa_attention_backward_launch(const lk::Args<T>& a, void* stream) {
  launch<T, true>(a, stream);
}

template void lisa_attention_forward_launch<float>(const lk::Args<float>&, void*);
template void lisa_attention_forward_launch<double>(const lk::Args<double>&, void*);
template void lisa_attention_backward_launch<float>(const lk::Args<float>&, void*);
template void lisa_attention_backward_launch<double>(const lk::Args<double>&, void*);

}  // namespace seqrec::ops::cuda
