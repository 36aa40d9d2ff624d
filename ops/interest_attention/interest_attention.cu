// LightSANs' causal interest attention on a CUDA device (see interest_attention_cuda.h): the
// kernels run the row functions of interest_attention_kernel.h, which describes the arithmetic,
// one warp per (sequence, head) walking its slots in order (forward) or in reverse chunk by chunk
// (backward), kRowWarps rows per block.
//
// Time O(L·k·Dh) per row; memory O(L·k) per row for the maxima, normalisers and scores kept for
// the backward, plus the chunk checkpoints and one chunk's aggregates: none of the reference's
// [B, L, k, D] interests.
#include "ops/interest_attention/interest_attention_cuda.h"

#include "ops/cuda_check.h"

namespace seqrec::ops::cuda {
namespace {

namespace ik = interest_kernel;

template <typename T, bool kBackward>
__global__ void __launch_bounds__(kRowThreads) interest_attention_rows(ik::Args<T> a) {
  const int64_t row = warp_row();
  if (row >= a.B * a.H) return;  // the whole warp leaves together
  DeviceWarp<ik::NoState> warp;
  warp.lane = warp_lane();
  if (kBackward)
    ik::backward_row<T>(warp, a, row);
  else
    ik::forward_row<T>(warp, a, row);
}

template <typename T, bool kBackward>
void launch(const ik::Args<T>& a, void* stream_ptr) {
  const int64_t rows = a.B * a.H;
  if (rows == 0 || a.L == 0) return;
  interest_attention_rows<T, kBackward><<<row_blocks(rows, "causal interest attention", "(sequence, head) rows"),
                                          kRowThreads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(a);
  SEQREC_CUDA_CHECK("causal interest attention", cudaGetLastError());
}

}  // namespace

template <typename T>
void interest_attention_forward_launch(const ik::Args<T>& a, void* stream) {
  launch<T, false>(a, stream);
}
template <typename T>
void interest_attention_backward_launch(const ik::Args<T>& a, void* stream) {
  launch<T, true>(a, stream);
}

template void interest_attention_forward_launch<float>(const ik::Args<float>&, void*);
template void interest_attention_forward_launch<double>(const ik::Args<double>&, void*);
template void interest_attention_backward_launch<float>(const ik::Args<float>&, void*);
template void interest_attention_backward_launch<double>(const ik::Args<double>&, void*);

}  // namespace seqrec::ops::cuda
