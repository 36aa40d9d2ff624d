// seqrec's caching host allocator (train/host_allocator.h): installed as LibTorch's CPU
// allocator, it must hand freed blocks back to later requests that fit them, keep its mapped
// memory within twice the peak in use (least recently freed blocks unmapped first), unmap
// blocks left idle, serve raw allocations and tensors from before it was installed, and stay
// consistent under threads.
#include "train/host_allocator.h"

#include <c10/core/Allocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace {
using seqrec::train::host_allocator_stats;

constexpr int64_t kMiB = 1 << 20;

// A float tensor of `bytes` bytes.
at::Tensor of_bytes(int64_t bytes) { return torch::empty({bytes / 4}, torch::kFloat32); }

class HostAllocator : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    before_ = new at::Tensor(torch::full({kMiB / 4}, 7.0f));  // from LibTorch's own allocator
    seqrec::train::install_host_allocator();
  }
  static void TearDownTestSuite() {
    delete before_;
    before_ = nullptr;
  }
  // Each test starts with no free blocks kept and the peak at what is in use now, so that what
  // it reuses and bounds is its own.
  void SetUp() override {
    seqrec::train::release_cached_host_blocks();
    seqrec::train::reset_host_allocator_peak();
  }
  static at::Tensor* before_;
};
at::Tensor* HostAllocator::before_ = nullptr;

TEST_F(HostAllocator, IsLibTorchsCpuAllocator) {
  ASSERT_TRUE(seqrec::train::host_allocator_installed());
  const auto s0 = host_allocator_stats();
  auto t = torch::randn({512, 512});  // 1 MiB, made by an op
  EXPECT_GE(host_allocator_stats().in_use_bytes - s0.in_use_bytes, kMiB);
  t = at::Tensor();
  EXPECT_EQ(host_allocator_stats().in_use_bytes, s0.in_use_bytes);
}

TEST_F(HostAllocator, TensorsFromBeforeInstallStayValid) {
  ASSERT_NE(before_, nullptr);
  EXPECT_TRUE(torch::all(*before_ == 7.0f).item<bool>());
  *before_ = at::Tensor();  // freed through LibTorch's own deleter, not this cache
  EXPECT_GE(host_allocator_stats().in_use_bytes, 0);
}

TEST_F(HostAllocator, AFreedBlockServesTheNextRequestOfItsSize) {
  auto a = of_bytes(3 * kMiB);
  void* p = a.data_ptr();
  a = at::Tensor();
  const auto s0 = host_allocator_stats();
  auto b = of_bytes(3 * kMiB);
  EXPECT_EQ(b.data_ptr(), p);
  const auto s1 = host_allocator_stats();
  EXPECT_EQ(s1.reuses, s0.reuses + 1);
  EXPECT_EQ(s1.maps, s0.maps);
  // Smaller (down to half) reuses it too; much smaller maps a block of its own.
  b = at::Tensor();
  auto c = of_bytes(3 * kMiB / 2 + 4096);
  EXPECT_EQ(c.data_ptr(), p);
  c = at::Tensor();
  auto d = of_bytes(kMiB);
  EXPECT_NE(d.data_ptr(), p);
  EXPECT_EQ(host_allocator_stats().maps, s0.maps + 1);
}

TEST_F(HostAllocator, SmallTensorsAreNotItsBusiness) {
  const auto s0 = host_allocator_stats();
  std::vector<at::Tensor> small;
  for (int i = 0; i < 50; ++i) small.push_back(of_bytes(64 * 1024));
  const auto s1 = host_allocator_stats();
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes);
  EXPECT_EQ(s1.maps, s0.maps);
  EXPECT_EQ(s1.reuses, s0.reuses);
}

TEST_F(HostAllocator, MappedMemoryStaysWithinTwiceThePeakInUse) {
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> size(256 * 1024, 32 * kMiB);
  std::vector<at::Tensor> live;
  for (int i = 0; i < 600; ++i) {
    if (live.size() > 6 || (!live.empty() && rng() % 2)) {
      live.erase(live.begin() + static_cast<int64_t>(rng() % live.size()));
    } else {
      live.push_back(of_bytes(size(rng) / 4 * 4));
    }
    const auto s = host_allocator_stats();
    ASSERT_LE(s.in_use_bytes + s.cached_bytes, 2 * s.peak_in_use_bytes) << "step " << i;
    ASSERT_GE(s.cached_bytes, 0);
  }
  live.clear();
  const auto s = host_allocator_stats();
  EXPECT_LE(s.cached_bytes, 2 * s.peak_in_use_bytes);
  EXPECT_GT(s.reuses, 0);
  seqrec::train::release_cached_host_blocks();
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
}

TEST_F(HostAllocator, TheBlockFreedLongestAgoMakesRoomFirst) {
  ASSERT_EQ(host_allocator_stats().in_use_bytes, 0);
  auto a = of_bytes(8 * kMiB), b = of_bytes(8 * kMiB);
  void* pb = b.data_ptr();
  a = at::Tensor();  // freed first
  b = at::Tensor();
  auto s = host_allocator_stats();
  ASSERT_EQ(s.cached_bytes, 16 * kMiB);
  const int64_t unmaps0 = s.unmaps;
  ASSERT_EQ(s.peak_in_use_bytes, 16 * kMiB);
  // Five 3 MiB blocks (too small to take an 8 MiB one) in use, then free: 31 MiB mapped, under
  // the cap of twice the peak (32 MiB).
  std::vector<at::Tensor> live;
  for (int i = 0; i < 5; ++i) live.push_back(of_bytes(3 * kMiB));
  EXPECT_EQ(host_allocator_stats().unmaps, unmaps0);
  live.clear();
  EXPECT_EQ(host_allocator_stats().cached_bytes, 31 * kMiB);
  // 3.5 MiB fits no free block (3 MiB is too small, 8 MiB more than twice): mapping it would
  // pass the cap, so the block freed longest ago (a's) goes.
  auto d = of_bytes(7 * kMiB / 2);
  s = host_allocator_stats();
  EXPECT_EQ(s.unmaps, unmaps0 + 1);
  EXPECT_EQ(s.cached_bytes, 23 * kMiB);
  EXPECT_LE(s.in_use_bytes + s.cached_bytes, 2 * s.peak_in_use_bytes);
  auto c = of_bytes(8 * kMiB);
  EXPECT_EQ(c.data_ptr(), pb) << "the block freed last should have stayed";
}

TEST_F(HostAllocator, IdleFreeBlocksAreUnmapped) {
  seqrec::train::set_host_allocator_idle_release(0.05);
  auto a = of_bytes(2 * kMiB);
  a = at::Tensor();
  auto s = host_allocator_stats();
  EXPECT_EQ(s.cached_bytes, 2 * kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  auto b = of_bytes(kMiB / 2);  // any call ages the cache out
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
  EXPECT_EQ(host_allocator_stats().unmaps, s.unmaps + 1);
  seqrec::train::set_host_allocator_idle_release(30);
}

TEST_F(HostAllocator, RawAllocationsRoundTrip) {
  c10::Allocator* alloc = c10::GetAllocator(c10::DeviceType::CPU);
  const auto s0 = host_allocator_stats();
  for (size_t n : {size_t{16}, size_t{100000}, size_t{1} << 18, size_t{5} << 20}) {
    auto* p = static_cast<unsigned char*>(alloc->raw_allocate(n));
    ASSERT_NE(p, nullptr) << n;
    p[0] = 1;
    p[n - 1] = 2;
    alloc->raw_deallocate(p);
  }
  EXPECT_EQ(host_allocator_stats().in_use_bytes, s0.in_use_bytes);
}

TEST_F(HostAllocator, ThreadsAllocateAndFreeConsistently) {
  const auto s0 = host_allocator_stats();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &bad] {
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int64_t> size(64 * 1024, 4 * kMiB);
      std::vector<std::pair<at::Tensor, float>> live;
      for (int i = 0; i < 300; ++i) {
        if (live.size() > 4) {
          auto& [x, v] = live.front();
          if (!torch::all(x == v).item<bool>()) ++bad;  // another thread wrote into this block
          live.erase(live.begin());
        }
        const float v = static_cast<float>(t * 1000 + i);
        live.emplace_back(torch::full({size(rng) / 4}, v), v);
      }
      for (auto& [x, v] : live)
        if (!torch::all(x == v).item<bool>()) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(host_allocator_stats().in_use_bytes, s0.in_use_bytes);
}

}  // namespace
