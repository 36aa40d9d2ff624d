#pragma once

#include <string>

namespace seqrec {

// Sets up the process's heap allocator for training: when the executable is linked with
// jemalloc (SEQREC_WITH_JEMALLOC) it already is the allocator and its start-up options are
// compiled in; otherwise glibc's malloc is told to keep large freed blocks. Call once, early.
void configure_allocator();

// One line for logs: which allocator serves this process and how it is set up.
std::string allocator_description();

}  // namespace seqrec
