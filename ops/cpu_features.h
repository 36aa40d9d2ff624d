#pragma once
// Function multi-versioning for the fused CPU kernels: on x86-64 with GCC or Clang a kernel's
// loops are compiled twice, once for the baseline and once under SEQREC_CPU_AVX2 (AVX2 + FMA),
// and cpu_has_avx2_fma() picks the second at run time when the CPU has both. A kernel that gains
// from AVX-512 (rows one 512-bit register wide, 64-bit lane multiplies) adds a third under
// SEQREC_CPU_AVX512, picked by cpu_has_avx512(). The environment variable SEQREC_CPU_LEVEL
// (baseline, avx2 or avx512) caps the choice, so that one machine can test every path
// (tests/ops registers the kernels' tests again under each lower level); unset, the CPU decides.
#include <cstdlib>
#include <stdexcept>
#include <string>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define SEQREC_CPU_X86 1
#define SEQREC_CPU_AVX2 __attribute__((target("avx2,fma")))
#define SEQREC_CPU_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#else
#define SEQREC_CPU_X86 0
#endif

namespace seqrec::ops {

// 0 baseline, 1 AVX2 + FMA, 2 AVX-512: the highest level SEQREC_CPU_LEVEL allows (2 when unset);
// any other value is an error naming it.
inline int cpu_level_cap() {
  static const int cap = [] {
    const char* env = std::getenv("SEQREC_CPU_LEVEL");
    const std::string v = env ? env : "";
    if (v.empty() || v == "avx512") return 2;
    if (v == "avx2") return 1;
    if (v == "baseline") return 0;
    throw std::invalid_argument("SEQREC_CPU_LEVEL must be baseline, avx2 or avx512, got '" + v + "'");
  }();
  return cap;
}

#if SEQREC_CPU_X86
inline bool cpu_has_avx2_fma() {
  static const bool yes = cpu_level_cap() >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
inline bool cpu_has_avx512() {
  static const bool yes = cpu_level_cap() >= 2 && cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq");
  return yes;
}
#else
inline bool cpu_has_avx2_fma() { return false; }
inline bool cpu_has_avx512() { return false; }
#endif

}  // namespace seqrec::ops
