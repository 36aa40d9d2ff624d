#pragma once
// What the CUDA kernels' bodies share between nvcc and the host compiler. A kernel's body is
// written once, in a header of its op, as functions of these qualifiers; the .cu file runs it on
// the device, and the default tests run the same functions on the CPU (each op's
// CudaKernelLogicMatchesCpuKernel) so that a machine without a GPU checks the kernels' indexing,
// reductions and edge cases. No Torch and no CUDA headers here.
//
// Warps: a body that reduces across a warp takes a Warp, DeviceWarp on the device (one lane per
// thread, xor shuffles) or EmulatedWarp on the CPU (all 32 lanes' states, each lane function
// run lane after lane, the same butterfly over the lanes' values), so that the emulation rounds
// every warp sum exactly as the device does.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ops/exp_nonpositive.h"

#if defined(__CUDACC__)
#define SEQREC_KERNEL_FN __host__ __device__ __forceinline__
#define SEQREC_KERNEL_UNROLL _Pragma("unroll")
#else
#define SEQREC_KERNEL_FN inline
#define SEQREC_KERNEL_UNROLL
#endif

namespace seqrec::ops::cuda {

constexpr int kWarpSize = 32;

// Kernels of one warp per row (LISA's, routing's) run kRowWarps rows per block.
constexpr int kRowWarps = 4;
constexpr int kRowThreads = kRowWarps * kWarpSize;

SEQREC_KERNEL_FN float kexp(float x) { return ::expf(x); }
SEQREC_KERNEL_FN double kexp(double x) { return ::exp(x); }
SEQREC_KERNEL_FN float klog(float x) { return ::logf(x); }
SEQREC_KERNEL_FN double klog(double x) { return ::log(x); }
template <typename T>
SEQREC_KERNEL_FN T kmax(T a, T b) {
  return a < b ? b : a;
}
template <typename T>
SEQREC_KERNEL_FN T kinf() {
  return static_cast<T>(HUGE_VAL);
}
// exp(x) for x <= 0: the device's exp there; on the host the branch-free polynomial of
// ops/exp_nonpositive.h (float; within 2 ulp, exp(-87) below -87), which a SIMD loop vectorises.
template <typename T>
SEQREC_KERNEL_FN T kexp_nonpositive(T x) {
#if defined(__CUDA_ARCH__)
  return kexp(x);
#else
  return exp_nonpositive(x);
#endif
}

// Segments: a row of L slots cut into pieces of seg_len slots (the last may be shorter), each
// walked by its own block or warp, for grids too short to fill the device (the linear and LISA
// kernels). seg_len <= 0 or >= L: one segment.
SEQREC_KERNEL_FN int64_t segments(int64_t L, int64_t seg_len) {
  return seg_len <= 0 || seg_len >= L ? 1 : (L + seg_len - 1) / seg_len;
}

// Slots [begin, end) of segment g.
template <typename I>
SEQREC_KERNEL_FN void segment_bounds(I L, I seg_len, I g, I& begin, I& end) {
  const I len = seg_len > 0 && seg_len < L ? seg_len : L;
  begin = g * len;
  end = begin + len < L ? begin + len : L;
}

// Slots per segment when `units` blocks or warps (one per row) fall short of `target`: L (one
// segment) when they do not or L is under 2·min_segment; else the fewest segments that reach the
// target, at most max_segments and L / min_segment of them, each rounded up to a multiple of
// `multiple` slots.
inline int64_t plan_segment_len(int64_t units, int64_t target, int64_t L, int64_t min_segment, int64_t max_segments,
                                int64_t multiple) {
  if (units <= 0 || units >= target || L < 2 * min_segment) return L;
  int64_t segs = (target + units - 1) / units;
  segs = segs < max_segments ? segs : max_segments;
  const int64_t most = L / min_segment;  // >= 2
  segs = segs < most ? segs : most;
  int64_t len = (L + segs - 1) / segs;
  len = (len + multiple - 1) / multiple * multiple;
  return len >= L ? L : len;
}

// The grid of a kernel of one warp per row: blocks of kRowWarps rows for `rows` rows, refused
// by name (what each row is: `what`) past the grid's 2^31 - 1 blocks, before any launch.
inline unsigned row_blocks(int64_t rows, const char* op, const char* what) {
  const int64_t blocks = (rows + kRowWarps - 1) / kRowWarps;
  if (blocks > 0x7fffffff)
    throw std::invalid_argument(std::string(op) + " (CUDA): " + std::to_string(rows) + " " + what +
                                " is beyond the kernel's grid");
  return static_cast<unsigned>(blocks);
}

// A warp on the CPU: the states of its 32 lanes. each(f) calls f(lane, state) for every lane in
// turn; sum(f) and max(f) combine the lanes' f(lane, state) by the butterfly of xor offsets
// 16, 8, 4, 2, 1 and return what every lane holds at the end; lead(f) is lane 0's f(); sync()
// orders the lanes' memory writes before the reads that follow (a body that passes values
// between lanes through memory calls it between the two).
template <typename S>
struct EmulatedWarp {
  static constexpr int kLanes = kWarpSize;
  S lanes[kWarpSize];

  template <class F>
  void each(F&& f) {
    for (int l = 0; l < kWarpSize; ++l) f(l, lanes[l]);
  }
  template <class F>
  void lead(F&& f) {
    f();
  }
  // The lanes run one call after another here, so what one lane wrote is already there.
  void sync() {}
  template <class F>
  auto sum(F&& f) {
    return butterfly(f, [](auto a, auto b) { return a + b; });
  }
  template <class F>
  auto max(F&& f) {
    return butterfly(f, [](auto a, auto b) { return kmax(a, b); });
  }

 private:
  template <class F, class Op>
  auto butterfly(F& f, Op op) {
    using T = decltype(f(0, lanes[0]));
    T v[kWarpSize], next[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) v[l] = f(l, lanes[l]);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      for (int l = 0; l < kWarpSize; ++l) next[l] = op(v[l], v[l ^ offset]);
      for (int l = 0; l < kWarpSize; ++l) v[l] = next[l];
    }
    return v[0];
  }
};

// One lane that owns every element: a body written with Warp::kLanes strides (lane k takes
// elements k, k + kLanes, ...) runs on the CPU as a plain loop, its sums in element order (the
// gated attention's rows on the CPU). Unlike EmulatedWarp it does not round as the device does;
// the emulation is what checks a kernel's lanes.
template <typename S>
struct SerialWarp {
  static constexpr int kLanes = 1;
  S state;

  template <class F>
  void each(F&& f) {
    f(0, state);
  }
  template <class F>
  void lead(F&& f) {
    f();
  }
  void sync() {}
  template <class F>
  auto sum(F&& f) {
    return f(0, state);
  }
  template <class F>
  auto max(F&& f) {
    return f(0, state);
  }
};

#if defined(__CUDACC__)
// In a kernel of kRowWarps rows per block: this warp's row, and this thread's lane in it.
__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
}
__device__ __forceinline__ int warp_lane() { return static_cast<int>(threadIdx.x % kWarpSize); }

// A warp on the device: this thread's lane and state; every lane of the warp must take part in
// each sum and max (full-mask shuffles).
template <typename S>
struct DeviceWarp {
  static constexpr int kLanes = kWarpSize;
  int lane;
  S state;

  template <class F>
  __device__ __forceinline__ void each(F&& f) {
    f(lane, state);
  }
  template <class F>
  __device__ __forceinline__ void lead(F&& f) {
    if (lane == 0) f();
  }
  // What a lane wrote to memory before this is visible to every lane after it.
  __device__ __forceinline__ void sync() { __syncwarp(); }
  template <class F>
  __device__ __forceinline__ auto sum(F&& f) {
    auto v = f(lane, state);
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
  template <class F>
  __device__ __forceinline__ auto max(F&& f) {
    auto v = f(lane, state);
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = kmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
  }
};
#endif

// x += v, atomically on the device (other warps add to the same element).
template <typename T>
SEQREC_KERNEL_FN void atomic_add(T* x, T v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(x, v);
#else
  *x += v;
#endif
}

}  // namespace seqrec::ops::cuda
