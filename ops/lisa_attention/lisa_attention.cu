// LISA's histogram attention on a CUDA device (see lisa_attention_cuda.h): the kernels run the
// row functions of lisa_attention_kernel.h, which describes the algorithm, one warp per
// (sequence, codebook) row and segment, kRowWarps warps per block.
//
// Time O(L · W) per row, registers O(W / 32) per lane, no shared memory, O(segments · W) per row
// for the segment sums; what the backward needs is A and r, kept by the forward.
#include "ops/lisa_attention/lisa_attention_cuda.h"

#include <stdexcept>
#include <string>

#include "ops/cuda_check.h"

namespace seqrec::ops::cuda {
namespace {

namespace lk = lisa_kernel;

template <typename T, int kPer, bool kBackward, bool kSumsOnly>
__global__ void __launch_bounds__(kRowThreads) lisa_kernel_rows(lk::Args<T> a) {
  const int64_t w = warp_row();
  if (w >= lk::launch_warps(a, kSumsOnly)) return;  // the whole warp leaves together
  DeviceWarp<lk::Lane<T, kPer>> warp;
  warp.lane = warp_lane();
  lk::run_warp<T, kPer, kBackward, kSumsOnly>(warp, a, w);
}

constexpr const char* kOp = "LISA attention";

template <typename T, bool kBackward>
void launch(const lk::Args<T>& args, void* stream_ptr) {
  if (args.W <= 0 || args.W > kLisaMaxCodewords)
    throw std::invalid_argument("LISA attention (CUDA): codewords per codebook must be in 1.." +
                                std::to_string(kLisaMaxCodewords) + ", got " + std::to_string(args.W));
  const int64_t rows = args.B * args.C;
  if (rows == 0 || args.L == 0) return;
  const lk::Args<T> a = lk::prepare(args);
  const int64_t segs = segments(a.L, a.seg_len);
  if (segs > 1 && a.sums == nullptr)
    throw std::invalid_argument("LISA attention (CUDA): " + std::to_string(segs) + " segments need a workspace of " +
                                std::to_string(lk::workspace_elements(rows, a.L, a.W, a.seg_len)) + " elements");
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  lk::with_per_lane(a.W, [&](auto per) {
    constexpr int P = decltype(per)::value;
    if (segs > 1) {
      const unsigned blocks = row_blocks(lk::launch_warps(a, true), kOp, "(row, segment) warps");
      lisa_kernel_rows<T, P, kBackward, true><<<blocks, kRowThreads, 0, stream>>>(a);
      SEQREC_CUDA_CHECK(kOp, cudaGetLastError());  // the segment sums' launch
    }
    const unsigned blocks = row_blocks(lk::launch_warps(a, false), kOp, "(row, segment) warps");
    lisa_kernel_rows<T, P, kBackward, false><<<blocks, kRowThreads, 0, stream>>>(a);
    SEQREC_CUDA_CHECK(kOp, cudaGetLastError());
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

int64_t lisa_attention_segment_len(int64_t rows, int64_t L) {
  return lk::plan_segment_len(rows, L, multiprocessors(kOp));
}

template void lisa_attention_forward_launch<float>(const lk::Args<float>&, void*);
template void lisa_attention_forward_launch<double>(const lk::Args<double>&, void*);
template void lisa_attention_backward_launch<float>(const lk::Args<float>&, void*);
template void lisa_attention_backward_launch<double>(const lk::Args<double>&, void*);

}  // namespace seqrec::ops::cuda
