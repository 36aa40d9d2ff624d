#pragma once
// The body of the causal linear-attention CUDA kernel (linear_attention.cu), written once for
// nvcc and the host compiler: the kernel runs its three phases per chunk with a block barrier
// between them, and emulate_block() runs the same phases on the CPU thread by thread (each
// phase for every thread before the next, which is what the barriers guarantee), so that a
// machine without a GPU tests the kernel's indexing, staging and reductions
// (LinearAttention.CudaKernelLogicMatchesCpuKernel). No Torch and no CUDA headers here.
//
// One thread block per (sequence, tile of kLanes value columns, segment). The running state
// S = sum_{s <= t} k[s] vᵀ[s] of the tile, [dk x kLanes], lives in registers: lane l holds
// column l, warp w the key rows w, w + kWarps, w + 2·kWarps, ... (kRows of them, a compile-time
// bound so that the state is never spilled). A block walks its segment in chunks of kSteps slots:
//   stage:       the chunk's q and k rows and the tile's v columns go to shared memory;
//   accumulate:  per slot, each thread adds k[t, i] v[t, l] to its rows of S and sums
//                q[t, i] S[i, l] over them into its warp's partial sum of out[t, l];
//   reduce:      the kWarps partial sums of each (slot, column) are added and written out.
// Segments (seg_len slots each, in walk order: reversed for the reverse product; kernel_common.h) let short
// grids fill the device: a first launch (sums only) writes each segment's own sum of k vᵀ to
// a workspace, and each block of the second starts its state from the sums of the segments
// before its own. With one segment (seg_len >= L) the second launch alone runs, from zero.
// A slot's output depends on slots <= t only (>= t in reverse), summed in the same order
// whatever follows, so a later slot cannot change an earlier output even by rounding.
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/kernel_common.h"

namespace seqrec::ops::cuda::linear_kernel {

constexpr int kLanes = 32;  // value columns per block, one per lane
constexpr int kWarps = 8;   // key-row partitions, one per warp
constexpr int kThreads = kLanes * kWarps;
constexpr int kSteps = 16;  // slots staged per chunk

// Segments: at least kMinSegment slots each (a multiple of kSteps), at most kMaxSegments per
// sequence, and only while the grid is short of kBlocksPerSm blocks per multiprocessor.
constexpr int kMinSegment = 64;
constexpr int kMaxSegments = 64;
constexpr int kBlocksPerSm = 4;

// The widest key rows: kWarps threads of at most 32 rows each.
constexpr int kMaxRows = 32;
constexpr int64_t kMaxWidth = static_cast<int64_t>(kWarps) * kMaxRows;

template <typename T>
struct Args {
  const T* q;  // [n, L, dk]
  const T* k;  // [n, L, dk]
  const T* v;  // [n, L, dv]
  T* out;      // [n, L, dv]
  int L, dk, dv;
  bool reverse;
  int seg_len;  // slots per segment in walk order; >= L: one segment
  T* sums;      // [n, tiles, segments, dk, kLanes]: each segment's own sum of k vᵀ (unused with one)
};

// Shared memory of one block, carved from one buffer of shared_bytes<T>(dk).
template <typename T>
struct Shared {
  T* qs;    // [kSteps][dk]
  T* ks;    // [kSteps][dk]
  T* vs;    // [kSteps][kLanes]
  T* part;  // [kSteps][kWarps][kLanes]
};

template <typename T>
SEQREC_KERNEL_FN size_t shared_bytes(int dk) {
  return sizeof(T) * (static_cast<size_t>(2) * kSteps * dk + kSteps * kLanes + kSteps * kWarps * kLanes);
}

template <typename T>
SEQREC_KERNEL_FN Shared<T> carve(void* raw, int dk) {
  Shared<T> s;
  s.qs = static_cast<T*>(raw);
  s.ks = s.qs + kSteps * dk;
  s.vs = s.ks + kSteps * dk;
  s.part = s.vs + kSteps * kLanes;
  return s;
}

// The slot at chunk position p of the chunk starting at walk position c0.
SEQREC_KERNEL_FN int64_t slot(int L, int c0, int p, bool reverse) { return reverse ? L - 1 - (c0 + p) : c0 + p; }

template <typename T>
SEQREC_KERNEL_FN void stage(const Args<T>& a, int64_t seq, int col0, int c0, int steps, int tid, const Shared<T>& s,
                            bool with_q = true) {
  const T* qn = a.q + seq * a.L * a.dk;
  const T* kn = a.k + seq * a.L * a.dk;
  const T* vn = a.v + seq * a.L * a.dv;
  for (int e = tid; e < steps * a.dk; e += kThreads) {
    const int p = e / a.dk, i = e - p * a.dk;
    const int64_t t = slot(a.L, c0, p, a.reverse);
    if (with_q) s.qs[e] = qn[t * a.dk + i];
    s.ks[e] = kn[t * a.dk + i];
  }
  for (int e = tid; e < steps * kLanes; e += kThreads) {
    const int p = e / kLanes, col = col0 + (e - p * kLanes);
    s.vs[e] = col < a.dv ? vn[slot(a.L, c0, p, a.reverse) * a.dv + col] : T(0);
  }
}

// kOutput = false: the state alone (the sums-only launch; q is not staged).
template <typename T, int kRows, bool kOutput = true>
SEQREC_KERNEL_FN void accumulate(int dk, int steps, int tid, T (&state)[kRows], const Shared<T>& s) {
  const int lane = tid % kLanes, warp = tid / kLanes;
  for (int p = 0; p < steps; ++p) {
    const T vt = s.vs[p * kLanes + lane];
    const T* qt = s.qs + p * dk;
    const T* kt = s.ks + p * dk;
    T acc = T(0);
    SEQREC_KERNEL_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int i = warp + r * kWarps;
      if (i < dk) {
        state[r] += kt[i] * vt;
        if (kOutput) acc += qt[i] * state[r];
      }
    }
    if (kOutput) s.part[(p * kWarps + warp) * kLanes + lane] = acc;
  }
}

template <typename T>
SEQREC_KERNEL_FN void reduce(const Args<T>& a, int64_t seq, int col0, int c0, int steps, int tid, const Shared<T>& s) {
  T* on = a.out + seq * a.L * a.dv;
  for (int e = tid; e < steps * kLanes; e += kThreads) {
    const int p = e / kLanes, l = e - p * kLanes, col = col0 + l;
    if (col >= a.dv) continue;
    T sum = T(0);
    SEQREC_KERNEL_UNROLL
    for (int w = 0; w < kWarps; ++w) sum += s.part[(p * kWarps + w) * kLanes + l];
    on[slot(a.L, c0, p, a.reverse) * a.dv + col] = sum;
  }
}

// The grid: blocks (seq, tile, segment) for seq < n, tile < tiles(dv), segment < segments.
SEQREC_KERNEL_FN int64_t tiles(int64_t dv) { return (dv + kLanes - 1) / kLanes; }

// Thread tid's first row of segment g's sum in the workspace; its row r is r·kWarps·kLanes
// further on, and a warp's 32 lanes touch 32 consecutive elements.
template <typename T>
SEQREC_KERNEL_FN T* sums_at(const Args<T>& a, int64_t seq, int tile, int g, int tid) {
  const int64_t block = (seq * tiles(a.dv) + tile) * segments(a.L, a.seg_len) + g;
  return a.sums + block * a.dk * kLanes + (tid / kLanes) * kLanes + tid % kLanes;
}

// The state at the start of segment g: the sums of segments 0 .. g-1, added in that order.
template <typename T, int kRows>
SEQREC_KERNEL_FN void init_state(const Args<T>& a, int64_t seq, int tile, int g, int tid, T (&state)[kRows]) {
  SEQREC_KERNEL_UNROLL
  for (int r = 0; r < kRows; ++r) state[r] = T(0);
  for (int h = 0; h < g; ++h) {
    const T* row = sums_at(a, seq, tile, h, tid);
    SEQREC_KERNEL_UNROLL
    for (int r = 0; r < kRows; ++r)
      if (tid / kLanes + r * kWarps < a.dk) state[r] += row[r * kWarps * kLanes];
  }
}

template <typename T, int kRows>
SEQREC_KERNEL_FN void store_sums(const Args<T>& a, int64_t seq, int tile, int g, int tid, const T (&state)[kRows]) {
  T* row = sums_at(a, seq, tile, g, tid);
  SEQREC_KERNEL_UNROLL
  for (int r = 0; r < kRows; ++r)
    if (tid / kLanes + r * kWarps < a.dk) row[r * kWarps * kLanes] = state[r];
}

// Slots per segment for n sequences of L slots with dv value columns on a device of sms
// multiprocessors: L (one segment) when the grid already has kBlocksPerSm blocks per
// multiprocessor or L is short; else the fewest segments that reach it, each a multiple of
// kSteps and at least kMinSegment slots, at most kMaxSegments of them.
inline int64_t plan_segment_len(int64_t n, int64_t L, int64_t dv, int64_t sms) {
  return cuda::plan_segment_len(n * tiles(dv), kBlocksPerSm * (sms > 0 ? sms : 1), L, kMinSegment, kMaxSegments,
                                kSteps);
}

// Workspace elements for the segment sums of one launch (0 with one segment).
inline int64_t workspace_elements(int64_t n, int64_t L, int64_t dk, int64_t dv, int64_t seg_len) {
  if (seg_len >= L) return 0;
  return n * tiles(dv) * ((L + seg_len - 1) / seg_len) * dk * kLanes;
}

// Calls f(std::integral_constant<int, R>{}) with the rows per thread for keys of width dk: the
// smallest power of two R with kWarps·R >= dk (1 <= dk <= kMaxWidth).
template <typename F>
void with_rows(int64_t dk, F&& f) {
  if (dk <= 1 * kWarps) return f(std::integral_constant<int, 1>{});
  if (dk <= 2 * kWarps) return f(std::integral_constant<int, 2>{});
  if (dk <= 4 * kWarps) return f(std::integral_constant<int, 4>{});
  if (dk <= 8 * kWarps) return f(std::integral_constant<int, 8>{});
  if (dk <= 16 * kWarps) return f(std::integral_constant<int, 16>{});
  f(std::integral_constant<int, kMaxRows>{});
}

// Block (seq, tile, g) of either launch on the CPU: the same phases, each for every thread in
// turn (what the block barriers order on the device).
template <typename T, int kRows, bool kSumsOnly>
void emulate_block(const Args<T>& a, int64_t seq, int tile, int g) {
  std::vector<unsigned char> raw(shared_bytes<T>(a.dk));
  const Shared<T> s = carve<T>(raw.data(), a.dk);
  std::vector<T> state(static_cast<size_t>(kThreads) * kRows, T(0));
  auto rows = [&](int tid) -> T(&)[kRows] { return *reinterpret_cast<T(*)[kRows]>(state.data() + tid * kRows); };
  const int col0 = tile * kLanes;
  int begin = 0, end = 0;
  segment_bounds(a.L, a.seg_len, g, begin, end);
  if (!kSumsOnly)
    for (int tid = 0; tid < kThreads; ++tid) init_state<T, kRows>(a, seq, tile, g, tid, rows(tid));
  for (int c0 = begin; c0 < end; c0 += kSteps) {
    const int steps = end - c0 < kSteps ? end - c0 : kSteps;
    for (int tid = 0; tid < kThreads; ++tid) stage(a, seq, col0, c0, steps, tid, s, !kSumsOnly);
    for (int tid = 0; tid < kThreads; ++tid) accumulate<T, kRows, !kSumsOnly>(a.dk, steps, tid, rows(tid), s);
    if (!kSumsOnly)
      for (int tid = 0; tid < kThreads; ++tid) reduce(a, seq, col0, c0, steps, tid, s);
  }
  if (kSumsOnly)
    for (int tid = 0; tid < kThreads; ++tid) store_sums<T, kRows>(a, seq, tile, g, tid, rows(tid));
}

// Both launches on the CPU, block by block: the sums of every segment but the last, then the
// outputs of every segment.
template <typename T>
void emulate(const Args<T>& a, int64_t n) {
  const int segs = static_cast<int>(segments(a.L, a.seg_len));
  with_rows(a.dk, [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    for (int64_t seq = 0; seq < n; ++seq)
      for (int tile = 0; tile < tiles(a.dv); ++tile)
        for (int g = 0; g + 1 < segs; ++g) emulate_block<T, R, true>(a, seq, tile, g);
    for (int64_t seq = 0; seq < n; ++seq)
      for (int tile = 0; tile < tiles(a.dv); ++tile)
        for (int g = 0; g < segs; ++g) emulate_block<T, R, false>(a, seq, tile, g);
  });
}

}  // namespace seqrec::ops::cuda::linear_kernel
