#include "launcher/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <stdexcept>

#include "train/host_allocator.h"

// Why a host allocator of our own (docs/benchmarks.md, "Heap allocator"): training frees and
// reallocates tensors of changing sizes every step (a mixture of experts' per-expert batches,
// length-trimmed slices). Kept in glibc's heap, which is what makes training fast here
// (machine-facts.md: returning blocks to the OS and faulting them back costs up to 5.5x on
// elementwise loops), those blocks fragment it without bound: FLASH4Rec's resident memory grew
// ~16-20 MB per step, 7 GB after ~490 steps, with at most ~0.8 GB live. Returning them instead
// (MALLOC_MMAP_THRESHOLD_=65536) keeps memory flat but doubles the step time; jemalloc is flat
// for FLASH4Rec only with purging off, and then grows for SASRec and LinRec.

namespace seqrec {
namespace {
std::string g_host = "system";
}

void configure_allocator(const std::string& host_allocator) {
  if (host_allocator != "caching" && host_allocator != "system")
    throw std::invalid_argument("--host_allocator must be 'caching' or 'system', got '" + host_allocator + "'");
  // Keep large freed blocks in the heap instead of returning them to the OS and faulting
  // them back every step. glibc's own MALLOC_*_ environment variables, when set, win.
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (host_allocator == "caching") train::install_host_allocator();
  g_host = host_allocator;
}

std::string allocator_description() {
  std::string glibc = "glibc malloc";
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"})
    if (const char* e = std::getenv(v)) glibc += std::string(" ") + v + "=" + e;
  if (g_host == "caching" && train::host_allocator_installed())
    return "seqrec caching host allocator for tensors >= 256 KiB, " + glibc + " for the rest";
  return glibc + " (--host_allocator=system: a long FLASH4Rec run grows, see docs/benchmarks.md)";
}

}  // namespace seqrec
