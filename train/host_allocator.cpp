#include "train/host_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace seqrec::train {
namespace {

constexpr size_t kPage = 4096;

// The block size for a request of n bytes: the next of 8 steps per power of two (at most 12.5%
// over), in whole pages.
size_t block_size(size_t n) {
  size_t top = size_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(n)));  // largest 2^k <= n
  const size_t step = std::max(kPage, top / 8);
  return (n + step - 1) / step * step;
}

class HostCache {
 public:
  explicit HostCache(size_t min_bytes) : min_bytes_(min_bytes) {}

  size_t min_bytes() const { return min_bytes_; }

  void set_idle_seconds(double s) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void* take(size_t n) {
    const size_t size = block_size(n);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    age_out_locked(now);
    void* p = nullptr;
    size_t got = size;
    // The smallest free block that fits, unless it is more than twice the size needed.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      it = std::prev(free_.upper_bound(it->first));  // of that size, the one freed last: still in cache
      got = it->first;
      p = it->second.p;
      by_age_.erase(it->second.freed);
      free_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(got);
      ++stats_.reuses;
    } else {
      // Mapped memory (in use + cached) stays within twice the peak in use: the free blocks
      // freed longest ago make room first.
      const int64_t in_use_after = stats_.in_use_bytes + static_cast<int64_t>(size);
      const int64_t cap = 2 * std::max(stats_.peak_in_use_bytes, in_use_after);
      while (!by_age_.empty() && in_use_after + stats_.cached_bytes > cap) unmap_oldest_locked();
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED && !free_.empty()) {  // give the cache back and try once more
        while (!by_age_.empty()) unmap_oldest_locked();
        p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      }
      TORCH_CHECK(p != MAP_FAILED, "host allocator: out of memory mapping ", size, " bytes for a tensor of ", n,
                  " bytes (", stats_.in_use_bytes, " bytes in use): ", std::strerror(errno));
#ifdef MADV_HUGEPAGE
      if (size >= (size_t{2} << 20)) madvise(p, size, MADV_HUGEPAGE);  // fewer first-touch faults
#endif
      ++stats_.maps;
    }
    sizes_[p] = got;
    stats_.in_use_bytes += static_cast<int64_t>(got);
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    return p;
  }

  // False when p is not one of this cache's blocks.
  bool give(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return false;
    const size_t size = it->second;
    sizes_.erase(it);
    stats_.in_use_bytes -= static_cast<int64_t>(size);
    const auto now = Clock::now();
    const uint64_t tick = ++clock_;
    auto f = free_.emplace(size, Free{p, tick});
    by_age_.emplace(tick, Aged{f, now});
    stats_.cached_bytes += static_cast<int64_t>(size);
    age_out_locked(now);
    return true;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!by_age_.empty()) unmap_oldest_locked();
  }

  HostAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Free {
    void* p;
    uint64_t freed;  // key in by_age_
  };
  using FreeMap = std::multimap<size_t, Free>;
  struct Aged {
    FreeMap::iterator block;
    Clock::time_point when;
  };

  void unmap_oldest_locked() {
    auto oldest = by_age_.begin();
    const auto block = oldest->second.block;
    munmap(block->second.p, block->first);
    stats_.cached_bytes -= static_cast<int64_t>(block->first);
    ++stats_.unmaps;
    free_.erase(block);
    by_age_.erase(oldest);
  }

  // Free blocks nobody asked for in idle_ go back to the OS (a phase such as evaluation that
  // used other sizes has ended).
  void age_out_locked(Clock::time_point now) {
    while (!by_age_.empty() && now - by_age_.begin()->second.when > idle_) unmap_oldest_locked();
  }

  const size_t min_bytes_;
  std::mutex mutex_;
  FreeMap free_;                       // free blocks by size
  std::map<uint64_t, Aged> by_age_;    // the same blocks, least recently freed first
  std::unordered_map<void*, size_t> sizes_;  // blocks in use
  uint64_t clock_ = 0;
  Clock::duration idle_ = std::chrono::seconds(30);
  HostAllocatorStats stats_;
};

// Never destroyed: tensors may be freed during static destruction.
HostCache* g_cache = nullptr;
bool installed = false;

// One deleter for both kinds of block, as raw_allocate()/raw_deallocate() require.
void free_block(void* p) {
  if (p && !g_cache->give(p)) c10::free_cpu(p);
}

class CachingHostAllocator final : public c10::Allocator {
 public:

  // LibTorch 2.3 dropped the const of allocate() and added copy_data(); both spellings are
  // declared (without `override`) so that this builds against 1.13 and 2.x alike.
  c10::DataPtr allocate(size_t n) const { return make(n); }
  c10::DataPtr allocate(size_t n) { return make(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count) std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

 private:
  static c10::DataPtr make(size_t n) {
    void* p = n < g_cache->min_bytes() ? c10::alloc_cpu(n) : g_cache->take(n);
    return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
};

}  // namespace

void install_host_allocator(size_t min_bytes) {
  static std::once_flag once;
  std::call_once(once, [min_bytes] {
    g_cache = new HostCache(std::max(min_bytes, kPage));
    static CachingHostAllocator allocator;
    c10::SetAllocator(c10::DeviceType::CPU, &allocator, /*priority=*/1);
    installed = c10::GetAllocator(c10::DeviceType::CPU) == &allocator;
  });
}

bool host_allocator_installed() { return installed; }

HostAllocatorStats host_allocator_stats() { return g_cache ? g_cache->stats() : HostAllocatorStats{}; }

void release_cached_host_blocks() {
  if (g_cache) g_cache->release();
}

void reset_host_allocator_peak() {
  if (g_cache) g_cache->reset_peak();
}

void set_host_allocator_idle_release(double seconds) {
  if (g_cache) g_cache->set_idle_seconds(seconds);
}

}  // namespace seqrec::train
