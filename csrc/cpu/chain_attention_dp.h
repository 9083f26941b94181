// The bf16 chain_attention kernel on native bf16 dot products (AVX512-BF16), included by
// chain_attention_cpu.cpp inside its AVX512 namespace (the softmax helpers of chain_attention_body.h
// compiled for the same target). No include guard on purpose.
// Against the generic body it widens nothing into scratch: each key row is read from the pool as 32
// bf16 pairs a step and scored by vdpbf16ps (exact bf16 products, fp32 sums) against the query rows
// held in registers; each value row is widened in registers and accumulated into the output rows'
// registers. The generic body's transposed fp32 copies of K and V (~130 KB a (request, KV head) at
// 256 keys, past L1) and its scalar transposing stores were most of its time.

// exp_nonpositive (chain_attention_body.h) on 16 lanes: the same Cephes polynomial, the same fused
// multiply-adds GCC makes of the scalar one. GCC left the scalar loop unvectorized here (perf: a third
// of the op at 16 requests x 4 rows).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r =
      _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
}

// exp_sum (chain_attention_body.h) with 16 exps a step: x[j] = exp(x[j] - m) in place over [0, n),
// summed in its order (16 lane sums over whole blocks, then the tail, then the lanes).
inline float exp_sum16(float* x, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 lanes = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
    _mm512_storeu_ps(x + j, e);
    lanes = _mm512_add_ps(lanes, e);
  }
  float s = 0.f;
  if (j < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(x + j, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mv)));
    for (; j < n; ++j) s += x[j];
  }
  float l[LANES];
  _mm512_storeu_ps(l, lanes);
  for (int64_t i = 0; i < LANES; ++i) s += l[i];
  return s;
}

// row_max (chain_attention_body.h) 16 lanes a step (a max is exact in any order).
inline float row_max16(const float* x, int64_t n) {
  __m512 lanes = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) lanes = _mm512_max_ps(lanes, _mm512_loadu_ps(x + j));
  float m = _mm512_reduce_max_ps(lanes);
  for (; j < n; ++j) m = m > x[j] ? m : x[j];
  return m;
}

// v[t] (16 partial sums of key t's score, t < 16) -> lane t = their sum: a transposing add tree,
// 45 shuffles and adds for 16 scores instead of a horizontal sum (~9 dependent ops) each.
inline __m512 sum16(const __m512* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)  // lane-local [t0 02, t1 02, t0 13, t1 13] for t = 2i, 2i + 1
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // each 128-bit lane L: keys 4i .. 4i + 3 summed over lane L
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const auto fold = [](__m512 x, __m512 y) {  // [x L0+L1, x L2+L3, y L0+L1, y L2+L3]
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  return fold(fold(b[0], b[1]), fold(b[2], b[3]));
}

constexpr int64_t DP_AHEAD = 16;  // keys ahead whose rows are prefetched (a key scores faster here than in attend)

// One request i, one KV head g, as attend(), its query rows [pass0 * RP, pass1 * RP) (a row r is
// query head g * group + r % group of block row r / group): DV = D / 16 (the fp32 registers of one
// head row), RP query rows a pass (RP * DV value accumulators, RP * D / 32 query registers); D = 16 *
// DV and D % 32 == 0. Each row's arithmetic is the same whatever RP (its own scores, sums and
// accumulators in key order), so RP only sets how often a (request, KV head)'s keys and values are
// walked, and a range of whole passes computes its rows as the whole unit would.
template <int DV, int RP = 16 / DV>
void attend_dp(const at::BFloat16* q, const at::BFloat16* kc, const at::BFloat16* vc, const int64_t* slots,
               int64_t prefix, int64_t B, int64_t H, int64_t Hkv, int64_t i, int64_t g, float scale, bool causal,
               at::BFloat16* out, int64_t pass0 = 0, int64_t pass1 = INT64_MAX / RP) {
  constexpr int64_t D = 16 * DV, KD = D / 32;
  const int64_t group = H / Hkv, L = prefix + B, RALL = B * group;
  const int64_t R0 = pass0 * RP, R = std::min(RALL, pass1 * RP), RPAD = (R - R0 + RP - 1) / RP * RP;
  if (R <= R0) return;
  thread_local std::vector<float> s_rows;
  s_rows.assign(RPAD * L, 0.f);  // rows past R and keys past a row's causal end stay 0: no weight
  float* s = s_rows.data();  // s[(r - R0) * L + j]: row r's score of key j
  const auto visible = [&](int64_t r) { return causal ? prefix + r / group + 1 : L; };
  const auto q_row = [&](int64_t r) { return q + ((i * B + r / group) * H + g * group + r % group) * D; };
  for (int64_t r0 = R0; r0 < R; r0 += RP) {
    __m512bh qv[RP][KD];
    for (int64_t u = 0; u < RP; ++u)
      for (int64_t c = 0; c < KD; ++c)
        qv[u][c] = (__m512bh)(r0 + u < R ? _mm512_loadu_si512(q_row(r0 + u) + 32 * c) : _mm512_setzero_si512());
    const int64_t n = visible(std::min(r0 + RP, R) - 1);  // the pass's last row sees the most keys
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {  // 16 keys a step, their 16 scores a row summed at once
      for (int64_t t = 0; t < 16 && j + t + DP_AHEAD < n; ++t)
        prefetch_row(kc + (slots[j + t + DP_AHEAD] * Hkv + g) * D, D);
      for (int64_t u = 0; u < RP; ++u) {
        __m512 acc[16];
        for (int64_t t = 0; t < 16; ++t) {
          const at::BFloat16* k = kc + (slots[j + t] * Hkv + g) * D;
          __m512 a = _mm512_setzero_ps();
          for (int64_t c = 0; c < KD; ++c) a = _mm512_dpbf16_ps(a, qv[u][c], (__m512bh)_mm512_loadu_si512(k + 32 * c));
          acc[t] = a;
        }
        _mm512_storeu_ps(s + (r0 - R0 + u) * L + j, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
      }
    }
    for (; j < n; ++j) {
      if (j + DP_AHEAD < n) prefetch_row(kc + (slots[j + DP_AHEAD] * Hkv + g) * D, D);
      const at::BFloat16* k = kc + (slots[j] * Hkv + g) * D;
      __m512bh kv[KD];
      for (int64_t c = 0; c < KD; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(k + 32 * c);
      for (int64_t u = 0; u < RP; ++u) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < KD; ++c) acc = _mm512_dpbf16_ps(acc, qv[u][c], kv[c]);
        s[(r0 - R0 + u) * L + j] = _mm512_reduce_add_ps(acc) * scale;
      }
    }
  }
  std::vector<float> w(RPAD, 0.f);
  for (int64_t r = R0; r < R; ++r) {
    float* row = s + (r - R0) * L;
    const int64_t n = visible(r);
    w[r - R0] = 1.f / exp_sum16(row, n, row_max16(row, n));
    for (int64_t j = n; j < L; ++j) row[j] = 0.f;  // scored in its pass, not visible to this row
  }
  for (int64_t r0 = R0; r0 < R; r0 += RP) {
    __m512 acc[RP][DV];
    for (auto& row : acc)
      for (auto& v : row) v = _mm512_setzero_ps();
    const int64_t n = visible(std::min(r0 + RP, R) - 1);
    for (int64_t j = 0; j < n; ++j) {
      if (j + DP_AHEAD < n) prefetch_row(vc + (slots[j + DP_AHEAD] * Hkv + g) * D, D);
      const at::BFloat16* v = vc + (slots[j] * Hkv + g) * D;
      __m512 vf[DV];
      for (int64_t c = 0; c < DV; ++c) vf[c] = load_bf16(v + 16 * c);
      for (int64_t u = 0; u < RP; ++u) {
        const __m512 p = _mm512_set1_ps(s[(r0 - R0 + u) * L + j]);
        for (int64_t c = 0; c < DV; ++c) acc[u][c] = _mm512_fmadd_ps(p, vf[c], acc[u][c]);
      }
    }
    for (int64_t u = 0; u < RP && r0 + u < R; ++u) {
      const int64_t r = r0 + u;
      float o[D];
      for (int64_t c = 0; c < DV; ++c)
        _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[u][c], _mm512_set1_ps(w[r - R0])));
      at::BFloat16* dst = out + ((i * B + r / group) * H + g * group + r % group) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<at::BFloat16>(o[d]);
    }
  }
}
