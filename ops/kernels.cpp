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
  if (name != "highest" && name != "high")
    throw std::invalid_argument("unknown --matmul_precision '" + name + "' (known: highest, high)");
  at::globalContext().setFloat32MatmulPrecision(name);
}

std::string matmul_precision() {
  return at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST ? "highest" : "high";
}

}  // namespace seqrec::ops
