// The causal linear-attention product on a CUDA device (see linear_attention_cuda.h).
//
// One thread block per (sequence, tile of 32 value columns). The running state
// S = sum_{s <= t} k[s] vᵀ[s], [dk x 32] for the tile, lives in registers: lane l holds column
// l, warp w holds the key rows w, w + 8, w + 16, ... (kRowsPerThread of them, a compile-time
// bound so that the state is never spilled to local memory). The sequence is walked in chunks
// of kSteps slots; each chunk's q, k and v rows are staged in shared memory, where a warp reads
// one key feature at a time (a broadcast). Per slot each thread adds k[t, i] v[t, l] to its
// rows of S and accumulates q[t, i] S[i, l] over them; the 8 warps' partial sums of a chunk
// are added in shared memory and written out. A slot's output depends on slots <= t only (or
// >= t in reverse), summed in the same order whatever follows, so a later slot cannot change
// an earlier output even by rounding.
//
// Time O(L · dk · dv) per sequence, memory O(chunk · dk) per block; nothing beyond the inputs
// is kept for the backward, which runs the same kernel three times (linear_attention_cuda.h).
#include "ops/linear_attention/linear_attention_cuda.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace seqrec::ops::cuda {
namespace {

constexpr int kLanes = 32;  // value columns per block, one per lane
constexpr int kWarps = 8;   // key-row partitions, one per warp
constexpr int kThreads = kLanes * kWarps;
constexpr int kSteps = 16;  // slots staged per chunk

template <typename T>
size_t shared_bytes(int dk) {
  // q and k rows, v tile, partial sums.
  return sizeof(T) * (static_cast<size_t>(2) * kSteps * dk + kSteps * kLanes + kSteps * kWarps * kLanes);
}

template <typename T, int kRowsPerThread>
__global__ void __launch_bounds__(kThreads)
    causal_linear_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ out, int L, int dk, int dv, bool reverse) {
  extern __shared__ unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kSteps][dk]
  T* ks = qs + kSteps * dk;                // [kSteps][dk]
  T* vs = ks + kSteps * dk;                // [kSteps][kLanes]
  T* part = vs + kSteps * kLanes;          // [kSteps][kWarps][kLanes]

  const int64_t seq = blockIdx.x;
  const int col0 = blockIdx.y * kLanes;
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const T* qn = q + seq * L * dk;
  const T* kn = k + seq * L * dk;
  const T* vn = v + seq * L * dv;
  T* on = out + seq * L * dv;

  T state[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) state[r] = T(0);

  for (int c0 = 0; c0 < L; c0 += kSteps) {
    const int steps = min(kSteps, L - c0);
    // Chunk position p holds slot c0 + p, or L - 1 - (c0 + p) when walking backwards.
    for (int e = threadIdx.x; e < steps * dk; e += kThreads) {
      const int p = e / dk, i = e - p * dk;
      const int64_t t = reverse ? L - 1 - (c0 + p) : c0 + p;
      qs[e] = qn[t * dk + i];
      ks[e] = kn[t * dk + i];
    }
    for (int e = threadIdx.x; e < steps * kLanes; e += kThreads) {
      const int p = e / kLanes, col = col0 + (e - p * kLanes);
      const int64_t t = reverse ? L - 1 - (c0 + p) : c0 + p;
      vs[e] = col < dv ? vn[t * dv + col] : T(0);
    }
    __syncthreads();

    for (int p = 0; p < steps; ++p) {
      const T vt = vs[p * kLanes + lane];
      const T* qt = qs + p * dk;
      const T* kt = ks + p * dk;
      T acc = T(0);
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int i = warp + r * kWarps;
        if (i < dk) {
          state[r] += kt[i] * vt;
          acc += qt[i] * state[r];
        }
      }
      part[(p * kWarps + warp) * kLanes + lane] = acc;
    }
    __syncthreads();

    for (int e = threadIdx.x; e < steps * kLanes; e += kThreads) {
      const int p = e / kLanes, l = e - p * kLanes, col = col0 + l;
      if (col >= dv) continue;
      T sum = T(0);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += part[(p * kWarps + w) * kLanes + l];
      const int64_t t = reverse ? L - 1 - (c0 + p) : c0 + p;
      on[t * dv + col] = sum;
    }
    __syncthreads();  // the next chunk overwrites the staged rows and the partial sums
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("causal linear attention (CUDA): ") + what + ": " + cudaGetErrorString(err));
}

template <typename T, int kRowsPerThread>
void launch(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t L, int64_t dk, int64_t dv, bool reverse,
            cudaStream_t stream) {
  auto kernel = causal_linear_kernel<T, kRowsPerThread>;
  const size_t smem = shared_bytes<T>(static_cast<int>(dk));
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "raising the shared-memory limit");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((dv + kLanes - 1) / kLanes));
  kernel<<<grid, kThreads, smem, stream>>>(q, k, v, out, static_cast<int>(L), static_cast<int>(dk),
                                          static_cast<int>(dv), reverse);
  check(cudaGetLastError(), "kernel launch");
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
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  // Rows per thread: the smallest power of two with kWarps of them covering dk.
  if (dk <= 1 * kWarps) return launch<T, 1>(q, k, v, out, n, L, dk, dv, reverse, stream);
  if (dk <= 2 * kWarps) return launch<T, 2>(q, k, v, out, n, L, dk, dv, reverse, stream);
  if (dk <= 4 * kWarps) return launch<T, 4>(q, k, v, out, n, L, dk, dv, reverse, stream);
  if (dk <= 8 * kWarps) return launch<T, 8>(q, k, v, out, n, L, dk, dv, reverse, stream);
  if (dk <= 16 * kWarps) return launch<T, 16>(q, k, v, out, n, L, dk, dv, reverse, stream);
  launch<T, 32>(q, k, v, out, n, L, dk, dv, reverse, stream);
}

template void causal_linear_attention_launch<float>(const float*, const float*, const float*, float*, int64_t,
                                                    int64_t, int64_t, int64_t, bool, void*);
template void causal_linear_attention_launch<double>(const double*, const double*, const double*, double*, int64_t,
                                                     int64_t, int64_t, int64_t, bool, void*);

}  // namespace seqrec::ops::cuda
