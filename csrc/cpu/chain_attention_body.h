// The chain_attention kernel body, included twice by chain_attention_cpu.cpp: once compiled for
// AVX2 + FMA (selected at run time where the CPU has them), once for the baseline ISA. No include
// guard on purpose. Plain loops over fixed-width lanes and 8-float vector values (GCC's vector extension),
// which the compiler lowers to the target's registers.

constexpr int64_t LANES = 16;

inline float widen(float v) { return v; }
inline float widen(at::BFloat16 v) { return __builtin_bit_cast(float, static_cast<uint32_t>(v.x) << 16); }

template <typename T>
inline void load(const T* src, float* dst, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = widen(src[d]);
}

constexpr int64_t AHEAD = 8;  // keys ahead whose rows are prefetched

template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(reinterpret_cast<const char*>(p) + b);
}

inline float row_max(const float* x, int64_t n) {
  float lanes[LANES];
  for (int64_t l = 0; l < LANES; ++l) lanes[l] = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int64_t l = 0; l < LANES; ++l) lanes[l] = lanes[l] > x[j + l] ? lanes[l] : x[j + l];
  float m = -std::numeric_limits<float>::infinity();
  for (; j < n; ++j) m = m > x[j] ? m : x[j];
  for (int64_t l = 0; l < LANES; ++l) m = m > lanes[l] ? m : lanes[l];
  return m;
}

// exp(x) for x <= 0 (scores minus their row max), Cephes' expf polynomial (~1 ulp): branch-free so
// a loop of it vectorizes (std::exp is a scalar libm call, ~60% of the op at 16 requests).
inline float exp_nonpositive(float x) {
  x = x > -87.0f ? x : -87.0f;  // exp(-87) ~ 1.6e-38: below every kept weight's resolution
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * z + r + 1.0f;
  return e * __builtin_bit_cast(float, static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

// exp(x - m) in place over x[0, n); returns their sum.
inline float exp_sum(float* x, int64_t n, float m) {
  for (int64_t j = 0; j < n; ++j) x[j] = exp_nonpositive(x[j] - m);
  float lanes[LANES] = {0.f};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int64_t l = 0; l < LANES; ++l) lanes[l] += x[j + l];
  float s = 0.f;
  for (; j < n; ++j) s += x[j];
  for (int64_t l = 0; l < LANES; ++l) s += lanes[l];
  return s;
}

// Eight floats as one value (GCC vector extension): one AVX2 register in the AVX2 build, two SSE
// registers in the baseline one; unaligned loads and stores through memcpy.
typedef float f8 __attribute__((vector_size(32)));
inline f8 load8(const float* p) {
  f8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, f8 v) { __builtin_memcpy(p, &v, sizeof v); }

constexpr int64_t QROWS = 4;  // query rows scored together: 4 x 2 independent FMA chains per key block
constexpr int64_t VCHUNK = 64;  // output columns accumulated in registers per pass over the values (8 FMA chains)

// One request i, one KV head g: its R = B * group query rows (row r of the block, head g*group+t)
// against keys 0 .. prefix + r (causal) or 0 .. prefix + B - 1 of its slot row.
// Scores as a small GEMM without horizontal sums: keys are widened into blocks of LANES transposed
// (kt[block][d][lane]), so each query row's scores for a block are LANES-wide FMAs over d, four rows
// at a time. Values are widened once (vf [L, D]) and each output row accumulates VCHUNK columns in
// registers over its visible keys. Each key and value row is read from the pool once.
template <typename T>
void attend(const T* q, const T* kc, const T* vc, const int64_t* slots, int64_t prefix, int64_t B, int64_t H,
            int64_t Hkv, int64_t D, int64_t i, int64_t g, float scale, bool causal, T* out) {
  const int64_t group = H / Hkv, L = prefix + B, NB = (L + LANES - 1) / LANES, LP = NB * LANES;
  const int64_t R = B * group, RP = (R + QROWS - 1) / QROWS * QROWS;
  std::vector<float> qf(RP * D, 0.f), s(RP * LP), kt(NB * D * LANES, 0.f), vf(L * D);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < group; ++t) {
      float* dst = qf.data() + (r * group + t) * D;
      load(q + ((i * B + r) * H + g * group + t) * D, dst, D);
      for (int64_t d = 0; d < D; ++d) dst[d] *= scale;
    }
  for (int64_t j = 0; j < L; ++j) {
    if (j + AHEAD < L) {  // slots scatter: no hardware prefetch
      prefetch_row(kc + (slots[j + AHEAD] * Hkv + g) * D, D);
      prefetch_row(vc + (slots[j + AHEAD] * Hkv + g) * D, D);
    }
    const T* k = kc + (slots[j] * Hkv + g) * D;
    float* col = kt.data() + (j / LANES) * D * LANES + j % LANES;
    for (int64_t d = 0; d < D; ++d) col[d * LANES] = widen(k[d]);
    load(vc + (slots[j] * Hkv + g) * D, vf.data() + j * D, D);
  }
  for (int64_t r = 0; r < RP; r += QROWS)
    for (int64_t b = 0; b < NB; ++b) {
      f8 acc[QROWS][2] = {};
      const float* kb = kt.data() + b * D * LANES;
      for (int64_t d = 0; d < D; ++d) {
        const f8 k0 = load8(kb + d * LANES), k1 = load8(kb + d * LANES + 8);
        for (int64_t u = 0; u < QROWS; ++u) {
          const float qv = qf[(r + u) * D + d];
          acc[u][0] += qv * k0;
          acc[u][1] += qv * k1;
        }
      }
      for (int64_t u = 0; u < QROWS; ++u) {
        store8(s.data() + (r + u) * LP + b * LANES, acc[u][0]);
        store8(s.data() + (r + u) * LP + b * LANES + 8, acc[u][1]);
      }
    }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < group; ++t) {
      float* row = s.data() + (r * group + t) * LP;
      const int64_t n = causal ? prefix + r + 1 : L;
      const float w = 1.f / exp_sum(row, n, row_max(row, n));
      T* o = out + ((i * B + r) * H + g * group + t) * D;
      for (int64_t d0 = 0; d0 < D; d0 += VCHUNK) {
        const int64_t m = D - d0 < VCHUNK ? D - d0 : VCHUNK;
        float a[VCHUNK] = {};
        if (m == VCHUNK) {  // a constant trip count: the compiler keeps a[] in registers
          for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < VCHUNK; ++c) a[c] += row[j] * vf[j * D + d0 + c];
        } else {
          for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < m; ++c) a[c] += row[j] * vf[j * D + d0 + c];
        }
        for (int64_t c = 0; c < m; ++c) o[d0 + c] = static_cast<T>(a[c] * w);
      }
    }
}
