// bf16_linear on CPU: y = x @ W^T (+ b) for bf16 x, W, b, accumulated in fp32, y rounded to bf16 once.
// Reference: sglang_dflash/kernels/reference.py (bf16_linear_ref).
//
// Why: on a host without native bf16 (AVX2 only), torch's bf16 matmul runs at ~10 GFLOP/s a core
// whatever the shape, so a 135M target's width-8 verify step costs 5x its fp32 one. Widening bf16
// to fp32 is a 16-bit shift, so W can stay bf16 in memory (half the bytes of fp32: what a one-row
// decode step is bound by) while the FMAs run in fp32 at AVX2 speed.
//   M <= 2 (decode): stream W once front to back, two rows at a time, 4 FMA chains per row.
//   M > 2 (verify rows): widen 4 rows of W into an fp32 tile once, then 3 x rows x 4 W rows of
//   fp32 dot products per pass over K (12 accumulators), so each widened W row serves all M rows.
// Where the CPU has AVX512-BF16 (and K % 32 == 0), every M runs native bf16 dot products instead
// (rows_dp, bf16_linear_dp.h): no widening, W streamed once for blocks of up to 6 x rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "cpu/bf16_vec.h"
#include "cpu/cpu_features.h"
#include "dflash_checks.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sglang_dflash {

namespace {

using bf16 = c10::BFloat16;
constexpr int64_t NB = 4;  // W rows (output columns) per tile
constexpr int64_t MB = 3;  // x rows per pass over a tile
constexpr int64_t PF = 4096;  // prefetch distance (elements): 8 KB ahead, into L2 (see rows_stream)
constexpr int64_t NS = 8;  // W rows per tile of the one-row (decode) path, and of the work split

inline float widen(bf16 v) { return static_cast<float>(v); }

// Portable path (and the tails): plain fp32 dot products.
void tile_scalar(const float* x, int64_t M, const bf16* w, int64_t n0, int64_t n1, int64_t K, const bf16* b, bf16* y,
                 int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    const bf16* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * widen(wr[k]);
      y[m * N + n] = bf16(acc + (b ? widen(b[n]) : 0.f));
    }
  }
}

#if defined(__x86_64__)
SGLANG_DFLASH_AVX2 inline __m256 load_bf16(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

SGLANG_DFLASH_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Decode shapes: each W row is read from memory once and widened in registers. Two W rows at a time,
// each split into 4 independent FMA chains over 32-element steps: 8 chains in flight, and W is read
// front to back in one sequential stream (rows n, n+1 are adjacent). The software prefetch 8 KB
// ahead goes into L2 (T1), not L1 (T0): an L1 prefetch holds one of the core's few L1 miss buffers
// until its line arrives, which capped one core's stream at ~10 GB/s; into L2 it streams at ~23 GB/s,
// this core's read bandwidth (one row over the embedded target's 269 MB: 26.5 -> 11.5 ms a step,
// a standalone C loop on the AVX512-BF16 host). K % 8 == 0 (the 32-step tail runs 8 at a time).
SGLANG_DFLASH_AVX2 void rows_stream(const float* x, int64_t M, const bf16* w, int64_t n0, int64_t n1, int64_t K,
                                    const bf16* b, bf16* y, int64_t N) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    const bf16 *r0 = w + n * K, *r1 = r0 + K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
      int64_t k = 0;
      for (; k + 32 <= K; k += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(r0 + k + PF), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(r1 + k + PF), _MM_HINT_T1);
        const __m256 x0 = _mm256_loadu_ps(xr + k), x1 = _mm256_loadu_ps(xr + k + 8);
        const __m256 x2 = _mm256_loadu_ps(xr + k + 16), x3 = _mm256_loadu_ps(xr + k + 24);
        a0 = _mm256_fmadd_ps(x0, load_bf16(r0 + k), a0);
        a1 = _mm256_fmadd_ps(x1, load_bf16(r0 + k + 8), a1);
        a2 = _mm256_fmadd_ps(x2, load_bf16(r0 + k + 16), a2);
        a3 = _mm256_fmadd_ps(x3, load_bf16(r0 + k + 24), a3);
        c0 = _mm256_fmadd_ps(x0, load_bf16(r1 + k), c0);
        c1 = _mm256_fmadd_ps(x1, load_bf16(r1 + k + 8), c1);
        c2 = _mm256_fmadd_ps(x2, load_bf16(r1 + k + 16), c2);
        c3 = _mm256_fmadd_ps(x3, load_bf16(r1 + k + 24), c3);
      }
      for (; k < K; k += 8) {
        const __m256 xv = _mm256_loadu_ps(xr + k);
        a0 = _mm256_fmadd_ps(xv, load_bf16(r0 + k), a0);
        c0 = _mm256_fmadd_ps(xv, load_bf16(r1 + k), c0);
      }
      const __m256 sa = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      const __m256 sc = _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3));
      y[m * N + n] = bf16(hsum(sa) + (b ? widen(b[n]) : 0.f));
      y[m * N + n + 1] = bf16(hsum(sc) + (b ? widen(b[n + 1]) : 0.f));
    }
  }
  tile_scalar(x, M, w, n, n1, K, b, y, N);
}

// Verify shapes: 4 W rows widened once into `wt` [NB, K], then MB x rows against them. K % 8 == 0.
SGLANG_DFLASH_AVX2 void rows_tiled(const float* x, int64_t M, const bf16* w, int64_t n0, int64_t n1, int64_t K,
                                   const bf16* b, bf16* y, int64_t N, float* wt) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    for (int64_t j = 0; j < NB; ++j)
      for (int64_t k = 0; k < K; k += 8) _mm256_storeu_ps(wt + j * K + k, load_bf16(w + (n + j) * K + k));
    const float *w0 = wt, *w1 = wt + K, *w2 = wt + 2 * K, *w3 = wt + 3 * K;
    int64_t m = 0;
    for (; m + MB <= M; m += MB) {
      const float *x0 = x + m * K, *x1 = x0 + K, *x2 = x1 + K;
      __m256 c[MB][NB];
      for (auto& row : c)
        for (auto& v : row) v = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; k += 8) {
        const __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        const __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
        const __m256 u[MB] = {_mm256_loadu_ps(x0 + k), _mm256_loadu_ps(x1 + k), _mm256_loadu_ps(x2 + k)};
        for (int64_t i = 0; i < MB; ++i) {
          c[i][0] = _mm256_fmadd_ps(u[i], v0, c[i][0]);
          c[i][1] = _mm256_fmadd_ps(u[i], v1, c[i][1]);
          c[i][2] = _mm256_fmadd_ps(u[i], v2, c[i][2]);
          c[i][3] = _mm256_fmadd_ps(u[i], v3, c[i][3]);
        }
      }
      for (int64_t i = 0; i < MB; ++i)
        for (int64_t j = 0; j < NB; ++j) y[(m + i) * N + n + j] = bf16(hsum(c[i][j]) + (b ? widen(b[n + j]) : 0.f));
    }
    for (; m < M; ++m) {
      const float* xr = x + m * K;
      __m256 a[NB] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t k = 0; k < K; k += 8) {
        const __m256 xv = _mm256_loadu_ps(xr + k);
        for (int64_t j = 0; j < NB; ++j) a[j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wt + j * K + k), a[j]);
      }
      for (int64_t j = 0; j < NB; ++j) y[m * N + n + j] = bf16(hsum(a[j]) + (b ? widen(b[n + j]) : 0.f));
    }
  }
  tile_scalar(x, M, w, n, n1, K, b, y, N);
}

#include "cpu/bf16_linear_dp.h"

#endif

}  // namespace

// x [..., K] bf16, weight [N, K] bf16 contiguous, bias [N] bf16 or None -> [..., N] bf16.
at::Tensor bf16_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "bf16_linear: x and weight must be bfloat16, got ", x.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "bf16_linear: x [..., K] and weight [N, K], got ",
              x.sizes(), " and ", weight.sizes());
  const int64_t K = weight.size(1), N = weight.size(0);
  const at::Tensor w = weight.contiguous();
  const at::Tensor x2 = x.reshape({-1, K});
  const int64_t M = x2.size(0);
#if defined(__x86_64__)
  const bool dp = has_avx512_bf16() && K % 32 == 0;
#else
  const bool dp = false;
#endif
  // x rows widened once (the AVX2 path). One row runs as two (the row twice, the copy's output dropped): streaming W
  // with two x rows per W row pair measured 27.6 -> 18.4 ms a step over the embedded target's
  // weights (one thread, AVX512-BF16 host; bench/cpu_linear_bench.py), the first row's arithmetic
  // unchanged, so its result is bit-identical.
  const bool twice = M == 1 && !dp;
  const at::Tensor xb = x2.contiguous();
  const at::Tensor xf = dp ? xb : (twice ? x2.expand({2, K}) : x2).to(at::kFloat).contiguous();
  std::optional<at::Tensor> bc;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == N, "bf16_linear: bias must be [N] bfloat16");
    bc = bias->contiguous();
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty({twice ? 2 : M, N}, x.options());
  if (M == 0 || N == 0) return y.view(out_shape);
  const float* xp = dp ? nullptr : xf.data_ptr<float>();
  const bf16* wp = w.data_ptr<bf16>();
  const bf16* bp = bc ? bc->data_ptr<bf16>() : nullptr;
  bf16* yp = y.data_ptr<bf16>();
  const int64_t tiles = (N + NS - 1) / NS;  // work split in 8-row tiles (both paths tile by 8 or 4)
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * NS, n1 = std::min(N, t1 * NS);
#if defined(__x86_64__)
    if (dp) {
      rows_dp(xb.data_ptr<bf16>(), M, wp, n0, n1, K, bp, yp, N);
      return;
    }
    if (has_avx2_fma() && K % 8 == 0) {
      if (M <= 2) {
        rows_stream(xp, twice ? 2 : M, wp, n0, n1, K, bp, yp, N);
      } else {
        std::vector<float> wt(NB * K);
        rows_tiled(xp, M, wp, n0, n1, K, bp, yp, N, wt.data());
      }
      return;
    }
#endif
    tile_scalar(xp, M, wp, n0, n1, K, bp, yp, N);
  });
  return (twice ? y.narrow(0, 0, 1).contiguous() : y).view(out_shape);
}

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) { m.impl("bf16_linear", &bf16_linear_cpu); }

}  // namespace sglang_dflash
