#include "ops/dropout/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace seqrec::ops {

uint64_t random_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

at::Tensor dropout_mask(const at::Tensor& like, double p, uint64_t seed) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  auto mask = torch::empty(like.sizes(), like.options().dtype(at::kFloat).device(at::kCPU));
  float* m = mask.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  // Four keep decisions per 64-bit hash, 16 bits each: keep when the 16-bit lane is >=
  // p * 2^16 (p is resolved to 1/65536, far below any dropout rate's meaning).
  const uint32_t threshold = static_cast<uint32_t>(p * 65536.0 + 0.5);
  const uint64_t base = mix64(seed ^ 0x9E3779B97F4A7C15ull);
  const int64_t n = mask.numel();
  at::parallel_for(0, (n + 3) / 4, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const uint64_t r = mix64(base + static_cast<uint64_t>(w) * 0x9E3779B97F4A7C15ull);
      const int64_t i0 = w * 4, lanes = std::min<int64_t>(4, n - i0);
      for (int64_t j = 0; j < lanes; ++j) m[i0 + j] = ((r >> (16 * j)) & 0xFFFF) >= threshold ? scale : 0.0f;
    }
  });
  return mask.to(like.options().dtype(like.scalar_type()).device(like.device()));
}

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  if (!training || p == 0) return x;
  if (!x.device().is_cpu()) return torch::dropout(x, p, true);
  return x * dropout_mask(x, p, random_seed());
}

}  // namespace seqrec::ops
