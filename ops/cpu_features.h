#pragma once
// Function multi-versioning for the fused CPU kernels: on x86-64 with GCC or Clang a kernel's
// loops are compiled twice, once for the baseline and once under SEQREC_CPU_AVX2 (AVX2 + FMA),
// and cpu_has_avx2_fma() picks the second at run time when the CPU has both. A kernel that gains
// from AVX-512 (rows one 512-bit register wide, 64-bit lane multiplies) adds a third under
// SEQREC_CPU_AVX512, picked by cpu_has_avx512().
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define SEQREC_CPU_X86 1
#define SEQREC_CPU_AVX2 __attribute__((target("avx2,fma")))
#define SEQREC_CPU_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#else
#define SEQREC_CPU_X86 0
#endif

namespace seqrec::ops {

#if SEQREC_CPU_X86
inline bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
inline bool cpu_has_avx512() {
  static const bool yes = cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq");
  return yes;
}
#else
inline bool cpu_has_avx2_fma() { return false; }
inline bool cpu_has_avx512() { return false; }
#endif

}  // namespace seqrec::ops
