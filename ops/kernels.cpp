#include "ops/kernels.h"

#include <ATen/Context.h>

#include <atomic>
#include <stdexcept>

namespace seqrec::ops {
namespace {
std::atomic<bool> g_fused{true};
}  // namespace

void set_fused_kernels(bool on) { g_fused.store(on, std::memory_order_relaxed); }
bool fused_kernels() { return g_fused.load(std::memory_order_relaxed); }

void set_matmul_precision(const std::string& name) {
  if (name != "highest" && name != "high" && name != "medium")
    throw std::invalid_argument("unknown --matmul_precision '" + name + "' (known: highest, high, medium)");
  at::globalContext().setFloat32MatmulPrecision(name);
}

std::string matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: return "highest";
    case at::Float32MatmulPrecision::HIGH: return "high";
    default: return "medium";
  }
}

bool cpu_has_bf16_dot() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

}  // namespace seqrec::ops
