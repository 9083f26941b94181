// CPU features the CPU ops ask at run time, one definition for all of them (GCC's
// __builtin_cpu_supports; false off x86-64, where only the baseline kernels are built).
#pragma once

namespace dflash_cpu {

inline bool has_avx2_fma() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

inline bool has_avx512f() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

inline bool has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

}  // namespace dflash_cpu
