#pragma once

#include <string>

namespace seqrec {

// Sets up how the process allocates host memory for training (call once, after flag parsing):
//   "caching": tensors of 256 KiB and more come from seqrec's caching host allocator
//              (train/host_allocator.h), everything else from glibc's malloc;
//   "system":  every tensor from glibc's malloc, as LibTorch does by default.
// In both, glibc is told to keep large freed blocks in its heap (unless its own MALLOC_*_
// environment variables say otherwise). Throws std::invalid_argument for another name.
void configure_allocator(const std::string& host_allocator);

// One line for logs: which allocator serves tensors and how it is set up.
std::string allocator_description();

}  // namespace seqrec
