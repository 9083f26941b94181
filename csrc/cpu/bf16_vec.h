// bf16 <-> fp32 on 16 AVX-512 lanes with c10's rounding (round to nearest even, NaN -> 0x7FC0), for
// the CPU ops that keep torch's bf16 rounding points bit for bit (rms_norm, rope_qk; chain_attention
// widens its values with load_bf16). Only called where the CPU has AVX-512 (cpu_features.h); nothing
// here off x86-64.
#pragma once

#if defined(__x86_64__)
#include <ATen/ATen.h>
#include <immintrin.h>

#include "cpu/cpu_features.h"

namespace sglang_dflash {
namespace avx512 {

using bf16 = at::BFloat16;

SGLANG_DFLASH_AVX512_WARNINGS_BEGIN

// The 16 bf16 bit patterns c10's float -> bf16 gives v's lanes, in the low halves of 32-bit lanes.
SGLANG_DFLASH_AVX512 inline __m512i to_bf16_bits(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}

// v rounded to bf16 and widened back: what float(bf16(x)) gives each lane.
SGLANG_DFLASH_AVX512 inline __m512 round_bf16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(to_bf16_bits(v), 16));
}

SGLANG_DFLASH_AVX512 inline void store_bf16(bf16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(to_bf16_bits(v)));
}

SGLANG_DFLASH_AVX512 inline __m512 load_bf16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Sixteen horizontal sums at once, each in _mm512_reduce_add_ps's order (lane i + lane i+8, then
// +4, +2, +1; a float add is commutative, so each sum is that function's to the bit), in 15 adds
// where sixteen separate reductions take 64 and leave sixteen scalars to round one by one.
// Result lane 4r + c is the sum of a[4c + r].
SGLANG_DFLASH_AVX512 inline __m512 reduce_add_16(const __m512 (&a)[16]) {
  __m512 s[8], z[4], e[2];
  for (int p = 0; p < 8; ++p)
    s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int q = 0; q < 4; ++q)
    z[q] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int h = 0; h < 2; ++h)
    e[h] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * h], z[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(z[2 * h], z[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

SGLANG_DFLASH_AVX512_WARNINGS_END

}  // namespace avx512
}  // namespace sglang_dflash
#endif
