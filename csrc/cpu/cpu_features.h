// CPU features the CPU ops ask at run time, one definition for all of them: the ISA level every
// kernel's dispatch reads. Levels nest (each implies the ones below it):
//   0 scalar, 1 avx2 (AVX2 + FMA), 2 avx512 (AVX-512F), 3 avx512bf16 (+ AVX512-BW, AVX512-BF16),
//   4 amx (+ AMX tiles and AMX-BF16, enabled by the OS: oneDNN's bf16 GEMMs, cpu/packed_weights.py).
// SGLANG_DFLASH_CPU_ISA (sglang_dflash/env.py CPU_ISA) caps the level below what the CPU has, so CI runs
// every lower path on any host; the level is read once per process (tests set it in a subprocess).
// Off x86-64 only the baseline kernels are built: the level is 0.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <strings.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

// The compile target of each level's kernels: one attribute per level, on every function built for it
// (the function runs only where isa_level() reaches that level). chain_attention_cpu.cpp instead
// compiles one kernel body per level under `#pragma GCC target` (its generic body has no intrinsics).
#define SGLANG_DFLASH_AVX2 __attribute__((target("avx2,fma")))
#define SGLANG_DFLASH_AVX512 __attribute__((target("avx512f")))
#define SGLANG_DFLASH_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Around AVX-512 code: GCC 12's AVX-512 intrinsics pass an _mm512_undefined_*() on purpose (and
// _mm512_reduce_add_ps reads one); -Werror would stop them.
#define SGLANG_DFLASH_AVX512_WARNINGS_BEGIN                                            \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SGLANG_DFLASH_AVX512_WARNINGS_END _Pragma("GCC diagnostic pop")

namespace sglang_dflash {

enum IsaLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };
inline constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};

#if defined(__x86_64__)
// AMX-BF16 and AMX-TILE (CPUID.7.0:EDX bits 22, 24) and the OS saving tile state (XCR0 bits 17, 18).
inline bool amx_bf16_usable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}
#endif

// The highest level this CPU (and its OS) supports.
inline int detected_isa() {
#if defined(__x86_64__)
  static const int level = [] {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return int(kScalar);
    if (!__builtin_cpu_supports("avx512f")) return int(kAvx2);
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512bf16")) return int(kAvx512);
    return int(amx_bf16_usable() ? kAmx : kAvx512Bf16);
  }();
  return level;
#else
  return kScalar;
#endif
}

// SGLANG_DFLASH_CPU_ISA: unset, empty or `auto` put no cap; an unknown value is an error naming the fix.
inline int isa_cap() {
  const char* v = std::getenv("SGLANG_DFLASH_CPU_ISA");
  if (v == nullptr || *v == '\0' || strcasecmp(v, "auto") == 0) return kAmx;
  for (int i = kScalar; i <= kAmx; ++i) {
    if (strcasecmp(v, kIsaNames[i]) == 0) return i;
  }
  TORCH_CHECK(false, "SGLANG_DFLASH_CPU_ISA=", v, ": expected one of auto, scalar, avx2, avx512, avx512bf16, amx");
}

// The level every CPU kernel dispatches on: what the CPU has, capped by SGLANG_DFLASH_CPU_ISA.
inline int isa_level() {
  static const int level = std::min(detected_isa(), isa_cap());
  return level;
}

inline bool has_avx2_fma() { return isa_level() >= kAvx2; }
inline bool has_avx512f() { return isa_level() >= kAvx512; }
inline bool has_avx512_bf16() { return isa_level() >= kAvx512Bf16; }
inline bool has_amx_bf16() { return isa_level() >= kAmx; }

}  // namespace sglang_dflash
