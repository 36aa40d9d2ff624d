// FLASH4Rec's gated attention on a CUDA device (see gated_attention_cuda.h): the kernels run the
// row functions of gated_attention_kernel.h, which describes the arithmetic, one warp per query
// row (forward, the backward's query pass) or key row (the backward's key pass), kRowWarps rows
// per block, each warp's scores in 2·L values of shared memory.
//
// Time O(L·(s + e)) per row; memory O(1) per row beyond the output (the row's stats and its
// dropped slots): no L x L tensor.
#include "ops/gated_attention/gated_attention_cuda.h"

#include "ops/cuda_check.h"

namespace seqrec::ops::cuda {
namespace {

namespace gk = gated_kernel;

enum Pass { kForward, kQueries, kKeys };

template <typename T, int kPass>
__global__ void __launch_bounds__(kRowThreads) gated_attention_rows(gk::Args<T> a) {
  extern __shared__ __align__(16) unsigned char shared[];
  T* sc = reinterpret_cast<T*>(shared) + static_cast<int64_t>(threadIdx.x / kWarpSize) * 2 * a.L;
  const int64_t row = warp_row();
  if (row >= a.B * a.H * a.L) return;  // the whole warp leaves together
  DeviceWarp<gk::NoState> warp;
  warp.lane = warp_lane();
  if (kPass == kForward)
    gk::forward_row<T>(warp, a, row, sc);
  else if (kPass == kQueries)
    gk::query_row<T>(warp, a, row, sc);
  else
    gk::key_row<T>(warp, a, row, sc);
}

constexpr const char* kOp = "gated attention";

template <typename T, int kPass>
void launch(const gk::Args<T>& a, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(kRowWarps) * 2 * a.L * sizeof(T);
  gated_attention_rows<T, kPass><<<row_blocks(a.B * a.H * a.L, kOp, "rows"), kRowThreads, bytes, stream>>>(a);
  SEQREC_CUDA_CHECK(kOp, cudaGetLastError());
}

void check_fits(int64_t L, int64_t bytes) {
  if (!gated_attention_cuda_fits(L, bytes))
    throw std::invalid_argument("gated attention (CUDA): L = " + std::to_string(L) +
                                " slots do not fit the kernel's shared-memory scratch");
}

}  // namespace

template <typename T>
void gated_attention_forward_launch(const gk::Args<T>& a, void* stream) {
  if (a.B * a.H * a.L == 0) return;
  check_fits(a.L, sizeof(T));
  launch<T, kForward>(a, static_cast<cudaStream_t>(stream));
}

template <typename T>
void gated_attention_backward_launch(const gk::Args<T>& a, void* stream) {
  if (a.B * a.H * a.L == 0) return;
  check_fits(a.L, sizeof(T));
  launch<T, kQueries>(a, static_cast<cudaStream_t>(stream));  // the key pass reads its stats
  launch<T, kKeys>(a, static_cast<cudaStream_t>(stream));
}

template void gated_attention_forward_launch<float>(const gk::Args<float>&, void*);
template void gated_attention_forward_launch<double>(const gk::Args<double>&, void*);
template void gated_attention_backward_launch<float>(const gk::Args<float>&, void*);
template void gated_attention_backward_launch<double>(const gk::Args<double>&, void*);

}  // namespace seqrec::ops::cuda
