// The chain_attention kernel body, included twice by chain_attention_cpu.cpp: once compiled for
// AVX2 + FMA (selected at run time where the CPU has them), once for the baseline ISA. No include
// guard on purpose. Plain loops over fixed-width lanes that the compiler vectorizes for the target.

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

// Fixed-width partial sums, so the compiler vectorizes the reduction without -ffast-math.
inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[LANES] = {0.f};
  int64_t d = 0;
  for (; d + LANES <= n; d += LANES)
    for (int64_t l = 0; l < LANES; ++l) lanes[l] += a[d + l] * b[d + l];
  float s = 0.f;
  for (; d < n; ++d) s += a[d] * b[d];
  for (int64_t l = 0; l < LANES; ++l) s += lanes[l];
  return s;
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

// One request i, one KV head g: its R = B * group query rows (row r of the block, head g*group+t)
// against keys 0 .. prefix + r (causal) or 0 .. prefix + B - 1 of its slot row.
template <typename T>
void attend(const T* q, const T* kc, const T* vc, const int64_t* slots, int64_t prefix, int64_t B, int64_t H,
            int64_t Hkv, int64_t D, int64_t i, int64_t g, float scale, bool causal, T* out) {
  const int64_t group = H / Hkv, R = B * group, L = prefix + B;
  std::vector<float> qf(R * D), s(R * L), acc(R * D, 0.f), kv(D), inv(R);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < group; ++t) {
      float* dst = qf.data() + (r * group + t) * D;
      load(q + ((i * B + r) * H + g * group + t) * D, dst, D);
      for (int64_t d = 0; d < D; ++d) dst[d] *= scale;
    }
  for (int64_t j = 0; j < L; ++j) {
    if (j + AHEAD < L) prefetch_row(kc + (slots[j + AHEAD] * Hkv + g) * D, D);  // slots scatter: no HW prefetch
    load(kc + (slots[j] * Hkv + g) * D, kv.data(), D);
    const int64_t r0 = causal && j > prefix ? j - prefix : 0;  // rows that see key j
    for (int64_t r = r0; r < B; ++r)
      for (int64_t t = 0; t < group; ++t) s[(r * group + t) * L + j] = dot(qf.data() + (r * group + t) * D, kv.data(), D);
  }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < group; ++t) {
      float* row = s.data() + (r * group + t) * L;
      const int64_t n = causal ? prefix + r + 1 : L;
      inv[r * group + t] = 1.f / exp_sum(row, n, row_max(row, n));
    }
  for (int64_t j = 0; j < L; ++j) {
    if (j + AHEAD < L) prefetch_row(vc + (slots[j + AHEAD] * Hkv + g) * D, D);
    load(vc + (slots[j] * Hkv + g) * D, kv.data(), D);
    const int64_t r0 = causal && j > prefix ? j - prefix : 0;
    for (int64_t r = r0; r < B; ++r)
      for (int64_t t = 0; t < group; ++t) {
        const float p = s[(r * group + t) * L + j];
        float* a = acc.data() + (r * group + t) * D;
        for (int64_t d = 0; d < D; ++d) a[d] += p * kv[d];
      }
  }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < group; ++t) {
      const float* a = acc.data() + (r * group + t) * D;
      const float w = inv[r * group + t];
      T* o = out + ((i * B + r) * H + g * group + t) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(a[d] * w);
    }
}
