// The causal linear-attention product on a CUDA device (see linear_attention_cuda.h): the
// kernel runs the phases of linear_attention_kernel.h, which describes the algorithm, with a
// block barrier between them; the launcher picks the rows per thread and the shared memory.
//
// Time O(L · dk · dv) per sequence, memory O(chunk · dk) per block and O(segments · dk · dv)
// per sequence for the segment sums; nothing beyond the inputs is kept for the backward, which
// runs the same kernel three times (linear_attention_cuda.h).
#include "ops/linear_attention/linear_attention_cuda.h"

#include <stdexcept>
#include <string>

#include "ops/cuda_check.h"
#include "ops/linear_attention/linear_attention_kernel.h"

namespace seqrec::ops::cuda {
namespace {

namespace lk = linear_kernel;

// kSumsOnly: each block writes its segment's own sum of k vᵀ (every segment but the last);
// else each block writes its segment's outputs, its state started from the earlier segments'.
template <typename T, int kRows, bool kSumsOnly>
__global__ void __launch_bounds__(lk::kThreads) causal_linear_kernel(lk::Args<T> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const lk::Shared<T> s = lk::carve<T>(smem_raw, a.dk);
  const int64_t seq = blockIdx.x;
  const int tile = blockIdx.y, g = blockIdx.z, col0 = tile * lk::kLanes, tid = threadIdx.x;
  int begin = 0, end = 0;
  segment_bounds(a.L, a.seg_len, g, begin, end);
  T state[kRows];
  if (kSumsOnly) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) state[r] = T(0);
  } else {
    lk::init_state<T, kRows>(a, seq, tile, g, tid, state);
  }
  for (int c0 = begin; c0 < end; c0 += lk::kSteps) {
    const int steps = min(lk::kSteps, end - c0);
    lk::stage(a, seq, col0, c0, steps, tid, s, !kSumsOnly);
    __syncthreads();
    lk::accumulate<T, kRows, !kSumsOnly>(a.dk, steps, tid, state, s);
    __syncthreads();
    if (!kSumsOnly) {
      lk::reduce(a, seq, col0, c0, steps, tid, s);
      __syncthreads();  // the next chunk overwrites the staged rows and the partial sums
    }
  }
  if (kSumsOnly) lk::store_sums<T, kRows>(a, seq, tile, g, tid, state);
}

constexpr const char* kOp = "causal linear attention";

}  // namespace

template <typename T>
void causal_linear_attention_launch(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t L, int64_t dk,
                                    int64_t dv, bool reverse, int64_t seg_len, T* sums, void* stream_ptr) {
  if (dk <= 0 || dv <= 0 || dk > kLinearAttentionMaxWidth || dv > kLinearAttentionMaxWidth)
    throw std::invalid_argument("causal linear attention (CUDA): widths must be in 1.." +
                                std::to_string(kLinearAttentionMaxWidth) + ", got dk " + std::to_string(dk) +
                                ", dv " + std::to_string(dv));
  if (n > 0x7fffffff || L > 0x7fffffff / (dk > dv ? dk : dv))
    throw std::invalid_argument("causal linear attention (CUDA): " + std::to_string(n) + " sequences of " +
                                std::to_string(L) + " slots is beyond the kernel's 32-bit grid and offsets");
  if (n == 0 || L == 0) return;
  if (seg_len <= 0 || seg_len > L) seg_len = L;
  const int segs = static_cast<int>(segments(L, seg_len));
  if (segs > 1 && sums == nullptr)
    throw std::invalid_argument("causal linear attention (CUDA): " + std::to_string(segs) +
                                " segments need a workspace of " +
                                std::to_string(lk::workspace_elements(n, L, dk, dv, seg_len)) + " elements");
  if (segs > 65535)
    throw std::invalid_argument("causal linear attention (CUDA): " + std::to_string(segs) +
                                " segments is beyond the grid's third dimension");
  const lk::Args<T> a{q,
                      k,
                      v,
                      out,
                      static_cast<int>(L),
                      static_cast<int>(dk),
                      static_cast<int>(dv),
                      reverse,
                      static_cast<int>(seg_len),
                      sums};
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t smem = lk::shared_bytes<T>(a.dk);
  const auto grid = [&](int z) {
    return dim3(static_cast<unsigned>(n), static_cast<unsigned>(lk::tiles(dv)), static_cast<unsigned>(z));
  };
  lk::with_rows(dk, [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    const auto sums_kernel = causal_linear_kernel<T, R, true>;
    const auto out_kernel = causal_linear_kernel<T, R, false>;
    if (smem > 48 * 1024) {
      SEQREC_CUDA_CHECK(kOp, cudaFuncSetAttribute(sums_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(smem)));
      SEQREC_CUDA_CHECK(kOp, cudaFuncSetAttribute(out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(smem)));
    }
    if (segs > 1) {
      sums_kernel<<<grid(segs - 1), lk::kThreads, smem, stream>>>(a);
      SEQREC_CUDA_CHECK(kOp, cudaGetLastError());  // the segment sums' launch
    }
    out_kernel<<<grid(segs), lk::kThreads, smem, stream>>>(a);
    SEQREC_CUDA_CHECK(kOp, cudaGetLastError());
  });
}

int64_t causal_linear_attention_segment_len(int64_t n, int64_t L, int64_t dv) {
  return lk::plan_segment_len(n, L, dv, multiprocessors(kOp));
}

template void causal_linear_attention_launch<float>(const float*, const float*, const float*, float*, int64_t,
                                                    int64_t, int64_t, int64_t, bool, int64_t, float*, void*);
template void causal_linear_attention_launch<double>(const double*, const double*, const double*, double*, int64_t,
                                                     int64_t, int64_t, int64_t, bool, int64_t, double*, void*);

}  // namespace seqrec::ops::cuda
