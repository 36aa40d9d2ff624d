#include "ops/kernels.h"

#include <atomic>

namespace seqrec::ops {
namespace {
std::atomic<bool> g_fused{true};
}  // namespace

void set_fused_kernels(bool on) { g_fused.store(on, std::memory_order_relaxed); }
bool fused_kernels() { return g_fused.load(std::memory_order_relaxed); }

}  // namespace seqrec::ops
