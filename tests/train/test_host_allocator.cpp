// seqrec's caching host allocator (train/host_allocator.h): installed as LibTorch's CPU
// allocator, it must hand freed blocks back to later requests of their size, keep no more free
// memory than the peak in use, serve raw allocations and tensors from before it was installed,
// and stay consistent under threads.
#include "train/host_allocator.h"

#include <c10/core/Allocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
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
  // Each test starts with no free blocks kept, so that what it reuses is its own.
  void SetUp() override { seqrec::train::release_cached_host_blocks(); }
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
  // A little smaller (within a quarter) reuses it too; much smaller maps a block of its own.
  b = at::Tensor();
  auto c = of_bytes(3 * kMiB - 300 * 1024);
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

TEST_F(HostAllocator, FreeMemoryNeverExceedsThePeakInUse) {
  seqrec::train::release_cached_host_blocks();
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> size(256 * 1024, 8 * kMiB);
  std::vector<at::Tensor> live;
  for (int i = 0; i < 400; ++i) {
    if (live.size() > 6 || (!live.empty() && rng() % 2)) {
      live.erase(live.begin() + static_cast<int64_t>(rng() % live.size()));
    } else {
      live.push_back(of_bytes(size(rng) / 4 * 4));
    }
    const auto s = host_allocator_stats();
    ASSERT_LE(s.cached_bytes, s.peak_in_use_bytes) << "step " << i;
    ASSERT_GE(s.cached_bytes, 0);
  }
  live.clear();
  const auto s = host_allocator_stats();
  EXPECT_LE(s.cached_bytes, s.peak_in_use_bytes);
  EXPECT_GT(s.reuses, 0);
  EXPECT_GT(s.unmaps, 0) << "with random sizes some freed blocks must go back to the OS";
  seqrec::train::release_cached_host_blocks();
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
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
