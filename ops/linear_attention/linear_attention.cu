// The causal linear-attention product on a CUDA device (see linear_attention_cuda.h): the
// kernel runs the phases of linear_attention_kernel.h, which describes the algorithm, with a
// block barrier between them; the launcher picks the rows per thread and the shared memory.
//
// Time O(L · dk · dv) per sequence, memory O(chunk · dk) per block; nothing beyond the inputs
// is kept for the backward, which runs the same kernel three times (linear_attention_cuda.h).
#include "ops/linear_attention/linear_attention_cuda.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "ops/linear_attention/linear_attention_kernel.h"

namespace seqrec::ops::cuda {
namespace {

namespace lk = linear_kernel;

template <typename T, int kRows>
__global__ void __launch_bounds__(lk::kThreads) causal_linear_kernel(lk::Args<T> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const lk::Shared<T> s = lk::carve<T>(smem_raw, a.dk);
  const int64_t seq = blockIdx.x;
  const int col0 = blockIdx.y * lk::kLanes, tid = threadIdx.x;
  T state[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) state[r] = T(0);
  for (int c0 = 0; c0 < a.L; c0 += lk::kSteps) {
    const int steps = min(lk::kSteps, a.L - c0);
    lk::stage(a, seq, col0, c0, steps, tid, s);
    __syncthreads();
    lk::accumulate<T, kRows>(a.dk, steps, tid, state, s);
    __syncthreads();
    lk::reduce(a, seq, col0, c0, steps, tid, s);
    __syncthreads();  // the next chunk overwrites the staged rows and the partial sums
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("causal linear attention (CUDA): ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

template <typename T>
void causal_linear_attention_launch(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t L, int64_t dk,
                                    int64_t dv, bool reverse, void* stream_ptr) {
  if (dk <= 0 || dv <= 0 || dk > kLinearAttentionMaxWidth || dv > kLinearAttentionMaxWidth)
    throw std::invalid_argument("causal linear attention (CUDA): widths must be in 1.." +
                                std::to_string(kLinearAttentionMaxWidth) + ", got dk " + std::to_string(dk) +
                                ", dv " + std::to_string(dv));
  if (n > 0x7fffffff || L > 0x7fffffff / (dk > dv ? dk : dv))
    throw std::invalid_argument("causal linear attention (CUDA): " + std::to_string(n) + " sequences of " +
                                std::to_string(L) + " slots is beyond the kernel's 32-bit grid and offsets");
  if (n == 0 || L == 0) return;
  const lk::Args<T> a{q, k, v, out, static_cast<int>(L), static_cast<int>(dk), static_cast<int>(dv), reverse};
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t smem = lk::shared_bytes<T>(a.dk);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(lk::tiles(dv)));
  lk::with_rows(dk, [&](auto rows) {
    const auto kernel = causal_linear_kernel<T, decltype(rows)::value>;
    if (smem > 48 * 1024)
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
            "raising the shared-memory limit");
    kernel<<<grid, lk::kThreads, smem, stream>>>(a);
    check(cudaGetLastError(), "kernel launch");
  });
}

template void causal_linear_attention_launch<float>(const float*, const float*, const float*, float*, int64_t,
                                                    int64_t, int64_t, int64_t, bool, void*);
template void causal_linear_attention_launch<double>(const double*, const double*, const double*, double*, int64_t,
                                                     int64_t, int64_t, int64_t, bool, void*);

}  // namespace seqrec::ops::cuda
