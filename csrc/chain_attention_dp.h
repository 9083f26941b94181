// The bf16 chain_attention kernel on native bf16 dot products (AVX512-BF16), included by
// chain_attention_cpu.cpp inside its AVX512 namespace (the softmax helpers of chain_attention_body.h
// compiled for the same target). No include guard on purpose.
// Against the generic body it widens nothing into scratch: each key row is read from the pool as 32
// bf16 pairs a step and scored by vdpbf16ps (exact bf16 products, fp32 sums) against the query rows
// held in registers; each value row is widened in registers and accumulated into the output rows'
// registers. The generic body's transposed fp32 copies of K and V (~130 KB a (request, KV head) at
// 256 keys, past L1) and its scalar transposing stores were most of its time.

constexpr int64_t DP_AHEAD = 16;  // keys ahead whose rows are prefetched (a key scores faster here than in attend)

// One request i, one KV head g, as attend(); DV = D / 16 (the fp32 registers of one head row),
// RP query rows a pass (RP * DV = 16 accumulators); D = 16 * DV and D % 32 == 0.
template <int DV>
void attend_dp(const at::BFloat16* q, const at::BFloat16* kc, const at::BFloat16* vc, const int64_t* slots,
               int64_t prefix, int64_t B, int64_t H, int64_t Hkv, int64_t i, int64_t g, float scale, bool causal,
               at::BFloat16* out) {
  constexpr int64_t D = 16 * DV, KD = D / 32, RP = 16 / DV;
  const int64_t group = H / Hkv, L = prefix + B, R = B * group, RPAD = (R + RP - 1) / RP * RP;
  thread_local std::vector<float> s;
  s.assign(RPAD * L, 0.f);  // rows past R and keys past a row's causal end stay 0: no weight
  const auto visible = [&](int64_t r) { return causal ? prefix + r / group + 1 : L; };
  const auto q_row = [&](int64_t r) { return q + ((i * B + r / group) * H + g * group + r % group) * D; };
  for (int64_t r0 = 0; r0 < R; r0 += RP) {
    __m512bh qv[RP][KD];
    for (int64_t u = 0; u < RP; ++u)
      for (int64_t c = 0; c < KD; ++c)
        qv[u][c] = (__m512bh)(r0 + u < R ? _mm512_loadu_si512(q_row(r0 + u) + 32 * c) : _mm512_setzero_si512());
    const int64_t n = visible(std::min(r0 + RP, R) - 1);  // the pass's last row sees the most keys
    for (int64_t j = 0; j < n; ++j) {
      if (j + DP_AHEAD < n) prefetch_row(kc + (slots[j + DP_AHEAD] * Hkv + g) * D, D);
      const at::BFloat16* k = kc + (slots[j] * Hkv + g) * D;
      __m512bh kv[KD];
      for (int64_t c = 0; c < KD; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(k + 32 * c);
      for (int64_t u = 0; u < RP; ++u) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < KD; ++c) acc = _mm512_dpbf16_ps(acc, qv[u][c], kv[c]);
        s[(r0 + u) * L + j] = _mm512_reduce_add_ps(acc) * scale;
      }
    }
  }
  std::vector<float> w(RPAD, 0.f);
  for (int64_t r = 0; r < R; ++r) {
    float* row = s.data() + r * L;
    const int64_t n = visible(r);
    w[r] = 1.f / exp_sum(row, n, row_max(row, n));
    for (int64_t j = n; j < L; ++j) row[j] = 0.f;  // scored in its pass, not visible to this row
  }
  for (int64_t r0 = 0; r0 < R; r0 += RP) {
    __m512 acc[RP][DV];
    for (auto& row : acc)
      for (auto& v : row) v = _mm512_setzero_ps();
    const int64_t n = visible(std::min(r0 + RP, R) - 1);
    for (int64_t j = 0; j < n; ++j) {
      if (j + DP_AHEAD < n) prefetch_row(vc + (slots[j + DP_AHEAD] * Hkv + g) * D, D);
      const at::BFloat16* v = vc + (slots[j] * Hkv + g) * D;
      __m512 vf[DV];
      for (int64_t c = 0; c < DV; ++c) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c));
        vf[c] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      for (int64_t u = 0; u < RP; ++u) {
        const __m512 p = _mm512_set1_ps(s[(r0 + u) * L + j]);
        for (int64_t c = 0; c < DV; ++c) acc[u][c] = _mm512_fmadd_ps(p, vf[c], acc[u][c]);
      }
    }
    for (int64_t u = 0; u < RP && r0 + u < R; ++u) {
      const int64_t r = r0 + u;
      float o[D];
      for (int64_t c = 0; c < DV; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[u][c], _mm512_set1_ps(w[r])));
      at::BFloat16* dst = out + ((i * B + r / group) * H + g * group + r % group) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<at::BFloat16>(o[d]);
    }
  }
}
