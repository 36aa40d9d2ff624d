// Routed attention on a CUDA device (see routing_attention_cuda.h): the kernels run the row
// functions of routing_attention_kernel.h, which describes the arithmetic, one warp per
// (sequence, head, query slot) and kRowWarps queries per block.
//
// Time O(W · (d + dv)) per query; memory O(W) per query (the probabilities kept for the
// backward, the dl scratch), none of the reference's [B, H, L, W, d] gathers.
#include "ops/routing_attention/routing_attention_cuda.h"

#include "ops/cuda_check.h"

namespace seqrec::ops::cuda {
namespace {

namespace rk = routing_kernel;

template <typename T, bool kBackward>
__global__ void __launch_bounds__(kRowThreads) routed_attention_rows(rk::Args<T> a) {
  const int64_t row = warp_row();
  if (row >= a.B * a.H * a.L) return;  // the whole warp leaves together
  DeviceWarp<rk::NoState> warp;
  warp.lane = warp_lane();
  if (kBackward)
    rk::backward_row<T>(warp, a, row);
  else
    rk::forward_row<T>(warp, a, row);
}

template <typename T, bool kBackward>
void launch(const rk::Args<T>& a, void* stream_ptr) {
  const int64_t rows = a.B * a.H * a.L;
  if (rows == 0) return;
  routed_attention_rows<T, kBackward>
      <<<row_blocks(rows, "routed attention", "query rows"), kRowThreads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(a);
  SEQREC_CUDA_CHECK("routed attention", cudaGetLastError());
}

}  // namespace

template <typename T>
void routed_attention_forward_launch(const rk::Args<T>& a, void* stream) {
  launch<T, false>(a, stream);
}
template <typename T>
void routed_attention_backward_launch(const rk::Args<T>& a, void* stream) {
  launch<T, true>(a, stream);
}

template void routed_attention_forward_launch<float>(const rk::Args<float>&, void*);
template void routed_attention_forward_launch<double>(const rk::Args<double>&, void*);
template void routed_attention_backward_launch<float>(const rk::Args<float>&, void*);
template void routed_attention_backward_launch<double>(const rk::Args<double>&, void*);

}  // namespace seqrec::ops::cuda
