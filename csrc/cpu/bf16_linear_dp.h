// bf16_linear on native bf16 dot products (AVX512-BF16), included by bf16_linear_cpu.cpp inside its
// anonymous namespace (its bf16, widen and PF). No include guard on purpose.
// Every output is one dot product of 16 fp32 lanes summed over k in order, then reduced in
// _mm512_reduce_add_ps's order and rounded once, whichever block shape computed it: a row's result
// does not depend on how many rows were verified with it (test_bf16_linear.py).

SGLANG_DFLASH_AVX512_WARNINGS_BEGIN
// Native bf16 dot products (AVX512-BF16): vdpbf16ps multiplies 32 bf16 pairs exactly and adds them
// into 16 fp32 lanes, so neither x nor W is widened. A block is MR x rows against NR W rows, 32 k a
// step, MR * NR accumulators; the W rows stream from memory once (prefetched into L2, as rows_stream does) and
// every x row of the block reuses them from registers. K % 32 == 0.
template <int MR, int NR>
SGLANG_DFLASH_AVX512BF16 inline void dp_block(const bf16* x, int64_t K, const bf16* w, int64_t n, const bf16* b,
                                              bf16* y, int64_t N) {
  __m512 acc[MR][NR];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  const bf16* r = w + n * K;
  for (int64_t k = 0; k < K; k += 32) {
    __m512bh wv[NR];
    for (int j = 0; j < NR; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(r + j * K + k + PF), _MM_HINT_T1);
      wv[j] = (__m512bh)_mm512_loadu_si512(r + j * K + k);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * K + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * N + n + j] = bf16(_mm512_reduce_add_ps(acc[i][j]) + (b ? widen(b[n + j]) : 0.f));
}

// Verify rows: MR (<= 6) x rows against 4 W rows, 32 k a step, MR x 4 accumulators (24 at 6 rows:
// enough independent chains to hide vdpbf16ps's latency over a K of a few hundred, and 10 loads a
// step for 24 dot products). Every output is dp_block's arithmetic to the bit (the same lanes summed
// over k in the same order, reduced in _mm512_reduce_add_ps's order), rounded 16 at a time.
// Only the first block of a tile prefetches: the later ones find the W rows in L1.
template <int MR, bool PREFETCH>
SGLANG_DFLASH_AVX512BF16 inline void verify_block(const bf16* x, int64_t K, const bf16* w, int64_t n, const bf16* b,
                                                  bf16* y, int64_t N) {
  __m512 acc[MR][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  const bf16* r = w + n * K;
  for (int64_t k = 0; k < K; k += 32) {
    __m512bh wv[4];
    for (int j = 0; j < 4; ++j) {
      if (PREFETCH) _mm_prefetch(reinterpret_cast<const char*>(r + j * K + k + PF), _MM_HINT_T1);
      wv[j] = (__m512bh)_mm512_loadu_si512(r + j * K + k);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * K + k);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  __m512 bias = _mm512_setzero_ps();  // + 0.f without a bias too, as dp_block adds (-0 becomes +0)
  if (b) {
    int64_t b4;  // b[n .. n+3], repeated for each of the 4 rows of a group
    std::memcpy(&b4, b + n, sizeof b4);
    bias = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_set1_epi64x(b4)), 16));
  }
  for (int i0 = 0; i0 < MR; i0 += 4) {
    const int rows = MR - i0 < 4 ? MR - i0 : 4;
    __m512 a[16];  // a[4j + i]: row i0 + i (a short group repeats its rows), column j
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 4; ++i) a[4 * j + i] = acc[i0 + i % rows][j];
    alignas(32) bf16 out[16];  // out[4i + j]
    _mm256_store_si256(reinterpret_cast<__m256i*>(out),
                       _mm512_cvtepi32_epi16(avx512::to_bf16_bits(_mm512_add_ps(avx512::reduce_add_16(a), bias))));
    for (int i = 0; i < rows; ++i) std::memcpy(y + (i0 + i) * N + n, out + 4 * i, 4 * sizeof(bf16));
  }
}

template <int MR>
SGLANG_DFLASH_AVX512BF16 void verify_rows(const bf16* x, int64_t K, const bf16* w, int64_t n, const bf16* b, bf16* y,
                                          int64_t N, bool first) {
  first ? verify_block<MR, true>(x, K, w, n, b, y, N) : verify_block<MR, false>(x, K, w, n, b, y, N);
}

// Rows n0..n1 of W against all M x rows, 4 W rows at a time: up to 3 x rows one by one (decode; the 4
// W rows stay in L1 between them), more in blocks of 6 and one block of the 1-5 left.
SGLANG_DFLASH_AVX512BF16 void rows_dp(const bf16* x, int64_t M, const bf16* w, int64_t n0, int64_t n1, int64_t K,
                                      const bf16* b, bf16* y, int64_t N) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    if (M < 4) {
      for (int64_t m = 0; m < M; ++m) dp_block<1, 4>(x + m * K, K, w, n, b, y + m * N, N);
      continue;
    }
    int64_t m = 0;
    for (; m + 6 <= M; m += 6) verify_rows<6>(x + m * K, K, w, n, b, y + m * N, N, m == 0);
    const bf16* xm = x + m * K;
    bf16* ym = y + m * N;
    const bool first = m == 0;
    switch (M - m) {
      case 5: verify_rows<5>(xm, K, w, n, b, ym, N, first); break;
      case 4: verify_rows<4>(xm, K, w, n, b, ym, N, first); break;
      case 3: verify_rows<3>(xm, K, w, n, b, ym, N, first); break;
      case 2: verify_rows<2>(xm, K, w, n, b, ym, N, first); break;
      case 1: verify_rows<1>(xm, K, w, n, b, ym, N, first); break;
    }
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) dp_block<1, 1>(x + m * K, K, w, n, b, y + m * N, N);
}

SGLANG_DFLASH_AVX512_WARNINGS_END
