#pragma once

#include <cstddef>
#include <cstdint>

namespace seqrec::train {

// A caching allocator for large host (CPU) tensors, installed as LibTorch's CPU allocator.
//
// Why: training frees and reallocates tensors of changing sizes every step (a mixture of
// experts' per-expert batches, length-trimmed slices). Served by glibc's heap (which keeps them
// to avoid page faults: machine-facts.md, 5.5x on elementwise loops), those blocks fragment the
// heap without bound: FLASH4Rec's resident memory grew ~16-20 MB per step, 7 GB after ~490
// steps, while the live tensors never exceeded ~0.8 GB. Returning them to the OS instead keeps
// memory flat but doubles the step time (every step faults its working set back in).
//
// What: blocks of at least `min_bytes` are their own anonymous mappings (never inside the
// malloc heap), rounded up to one of 8 sizes per power of two; a freed block is kept for the
// next request that fits it (the smallest such block, at most twice the size asked for), so a
// steady training loop stops mapping and faulting after its first steps. Two bounds keep the
// cache from growing: mapped memory (in use + free) stays within twice the peak in use, the
// blocks freed longest ago unmapped first to make room; and a free block nobody asked for in
// the idle-release time (30 s) is unmapped. Smaller requests go to c10's own allocator.
struct HostAllocatorStats {
  int64_t in_use_bytes = 0;      // blocks held by tensors now
  int64_t cached_bytes = 0;      // free blocks kept mapped for reuse
  int64_t peak_in_use_bytes = 0;
  int64_t maps = 0;              // mmap calls so far
  int64_t unmaps = 0;
  int64_t reuses = 0;            // requests served from the cache
};

// Installs the allocator for the device type CPU (idempotent). Tensors allocated before keep
// their own deleters, so they stay valid.
void install_host_allocator(size_t min_bytes = size_t{1} << 18);
bool host_allocator_installed();
HostAllocatorStats host_allocator_stats();
// Unmaps every cached free block (blocks in use are untouched).
void release_cached_host_blocks();
// Sets the peak to the bytes in use now; the bound on mapped memory follows the new peak.
void reset_host_allocator_peak();
// How long a free block may stay unused before it is unmapped (default 30 s).
void set_host_allocator_idle_release(double seconds);

}  // namespace seqrec::train
