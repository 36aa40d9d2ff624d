#include "launcher/allocator.h"

#include <malloc.h>

#include <cstddef>
#include <cstdlib>

// Why not glibc's malloc alone: training frees and reallocates tensors of changing sizes every
// step (a mixture of experts' per-expert batches, variable-length slices). With large blocks
// kept in glibc's heap, which is what makes training fast here (machine-facts.md: returning
// them to the OS and faulting them back costs up to 5.5x on elementwise loops), the heap
// fragments without bound: FLASH4Rec's resident memory grew ~16-20 MB per step, 7 GB after
// ~490 steps. Returning large blocks to the OS instead (MALLOC_MMAP_THRESHOLD_=65536) keeps it
// flat but doubles the step time. jemalloc with purging disabled does both: flat memory at
// glibc's speed (docs/benchmarks.md, "Allocator").

#ifdef SEQREC_WITH_JEMALLOC
// jemalloc's compiled-in options; its MALLOC_CONF environment variable is applied after these
// and so can override them. Freed pages stay mapped for reuse (never purged): the working
// set of one step is what the next step needs again.
extern "C" {
const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
}
#endif

namespace seqrec {

void configure_allocator() {
#ifndef SEQREC_WITH_JEMALLOC
  // Keep large freed blocks in the heap instead of returning them to the OS and faulting
  // them back every step. glibc's own MALLOC_*_ environment variables, when set, win.
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

std::string allocator_description() {
#ifdef SEQREC_WITH_JEMALLOC
  const char* version = nullptr;
  size_t len = sizeof(version);
  if (mallctl("version", &version, &len, nullptr, 0) == 0 && version) {
    std::string v = version;
    std::string d = "jemalloc " + v.substr(0, v.find('-')) + " (" + malloc_conf + ")";
    if (const char* env = std::getenv("MALLOC_CONF")) d += std::string(", MALLOC_CONF=") + env;
    return d;
  }
  return "jemalloc (linked, version unknown)";
#else
  return "glibc malloc (jemalloc not linked: a long FLASH4Rec run grows, see docs/benchmarks.md)";
#endif
}

}  // namespace seqrec
