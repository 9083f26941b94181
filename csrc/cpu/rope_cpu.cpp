// rope_qk on CPU for bf16 q/k: SGLang's RotaryEmbedding.forward_native (rotary_embedding/base.py +
// utils.apply_rotary_emb) in one pass over the rows instead of ~25 torch ops a layer, with its rounding
// points kept: cos/sin rounded to bf16, then each product and each sum rounded to bf16 as bf16 torch
// does op by op, so the result is bit-identical. Reference: sglang_dflash/kernels/reference.py (rope_qk_ref).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>

#include "cpu/bf16_vec.h"
#include "cpu/cpu_features.h"

namespace sglang_dflash {

namespace {

using bf16 = at::BFloat16;

inline float r16(float v) { return static_cast<float>(bf16(v)); }  // one bf16 rounding

// x: T rows of heads x head_size, row t at x + t * xs -> out [T, heads, head_size], rotating the first rd
// dims of every head of token t.
void rotate(const bf16* x, int64_t xs, bf16* out, int64_t t, int64_t heads, int64_t head_size, int64_t rd,
            const float* cs, bool neox) {
  const int64_t half = rd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const bf16* xi = x + t * xs + h * head_size;
    bf16* o = out + (t * heads + h) * head_size;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const float x1 = static_cast<float>(xi[a]), x2 = static_cast<float>(xi[b]);
      const float c = cs[i], s = cs[half + i];
      o[a] = bf16(r16(x1 * c) - r16(x2 * s));
      o[b] = bf16(r16(x2 * c) + r16(x1 * s));
    }
    for (int64_t i = rd; i < head_size; ++i) o[i] = xi[i];
  }
}

#if defined(__x86_64__)
using avx512::load_bf16;
using avx512::round_bf16;
using avx512::store_bf16;
SGLANG_DFLASH_AVX512_WARNINGS_BEGIN

// rotate for the neox style with half a multiple of 16, 16 pairs a step: the same products, sums and
// roundings lane by lane (a served 4-row verify of 32 requests spent ~10 ms a step in the scalar loop).
SGLANG_DFLASH_AVX512 void rotate16(const bf16* x, int64_t xs, bf16* out, int64_t t, int64_t heads, int64_t head_size,
                                   int64_t rd, const float* cs) {
  const int64_t half = rd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const bf16* xi = x + t * xs + h * head_size;
    bf16* o = out + (t * heads + h) * head_size;
    for (int64_t i = 0; i < half; i += 16) {
      const __m512 x1 = load_bf16(xi + i), x2 = load_bf16(xi + half + i);
      const __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(cs + half + i);
      store_bf16(o + i, _mm512_sub_ps(round_bf16(_mm512_mul_ps(x1, c)), round_bf16(_mm512_mul_ps(x2, s))));
      store_bf16(o + half + i, _mm512_add_ps(round_bf16(_mm512_mul_ps(x2, c)), round_bf16(_mm512_mul_ps(x1, s))));
    }
    for (int64_t i = rd; i < head_size; ++i) o[i] = xi[i];
  }
}

// One position's cos | sin row as the rotation reads it: rounded to bf16 (exact for a bf16 cache).
SGLANG_DFLASH_AVX512 void cos_sin16(const float* row, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, round_bf16(_mm512_loadu_ps(row + i)));
}
SGLANG_DFLASH_AVX512 void cos_sin16(const bf16* row, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, load_bf16(row + i));
}
SGLANG_DFLASH_AVX512_WARNINGS_END
#endif

}  // namespace

// positions [T] int; query [T, Hq * head_size] or [T, Hq, head_size] bf16, key likewise with Hk heads;
// cos_sin_cache [max_pos, rd] (cos | sin halves, any float dtype) -> (query, key) rotated, new tensors.
std::tuple<at::Tensor, at::Tensor> rope_qk_cpu(const at::Tensor& positions, const at::Tensor& query,
                                               const at::Tensor& key, const at::Tensor& cos_sin_cache,
                                               int64_t head_size, bool neox) {
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && key.scalar_type() == at::kBFloat16,
              "rope_qk: query and key must be bfloat16, got ", query.scalar_type(), " and ", key.scalar_type());
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) % 2 == 0 && cos_sin_cache.size(1) <= head_size,
              "rope_qk: cos_sin_cache must be [max_pos, rotary_dim] with an even rotary_dim <= head_size ", head_size,
              ", got ", cos_sin_cache.sizes());
  const int64_t T = positions.numel(), rd = cos_sin_cache.size(1);
  TORCH_CHECK(T == 0 || (query.numel() % (T * head_size) == 0 && key.numel() % (T * head_size) == 0), "rope_qk: query ",
              query.sizes(), " and key ", key.sizes(), " must hold ", T, " tokens of whole heads of head_size ",
              head_size);
  const at::Tensor pos = positions.reshape({-1}).to(at::kLong).contiguous();
  // cos/sin as bf16 torch sees them (`.to(x.dtype)`), widened back for the products: gathered and
  // rounded here for an fp32 or bf16 cache (SGLang's), through torch's ops for any other dtype.
  at::Tensor cs;
  const auto cache_dtype = cos_sin_cache.scalar_type();
  if (cache_dtype == at::kFloat || cache_dtype == at::kBFloat16) {
    const at::Tensor cc = cos_sin_cache.contiguous();
    cs = at::empty({T, rd}, cos_sin_cache.options().dtype(at::kFloat));
    const int64_t* pp = pos.data_ptr<int64_t>();
    float* out = cs.data_ptr<float>();
    const bool v16_cs = rd % 16 == 0 && has_avx512f();
    const auto gather = [&](const auto* cache) {  // r16 leaves a bf16 cache's values as they are
      for (int64_t t = 0; t < T; ++t) {
        TORCH_CHECK(pp[t] >= 0 && pp[t] < cc.size(0), "rope_qk: position ", pp[t], " outside the cos_sin_cache's ",
                    cc.size(0), " rows");
#if defined(__x86_64__)
        if (v16_cs) {
          cos_sin16(cache + pp[t] * rd, out + t * rd, rd);
          continue;
        }
#endif
        for (int64_t i = 0; i < rd; ++i) out[t * rd + i] = r16(static_cast<float>(cache[pp[t] * rd + i]));
      }
    };
    if (cache_dtype == at::kFloat)
      gather(cc.data_ptr<float>());
    else
      gather(cc.data_ptr<bf16>());
  } else {
    cs = cos_sin_cache.index_select(0, pos).to(at::kBFloat16).to(at::kFloat).contiguous();
  }
  // [T, heads * head_size] views with dense rows (q and k as narrowed from the fused QKV output) are read
  // in place; anything else is made contiguous first.
  const auto dense_rows = [T](const at::Tensor& x) { return x.dim() == 2 && x.size(0) == T && x.stride(1) == 1; };
  const at::Tensor q = dense_rows(query) ? query : query.contiguous();
  const at::Tensor k = dense_rows(key) ? key : key.contiguous();
  at::Tensor qo = at::empty(query.sizes(), query.options()), ko = at::empty(key.sizes(), key.options());
  if (T == 0) return {qo, ko};
  const int64_t hq = q.numel() / (T * head_size), hk = k.numel() / (T * head_size);
  const int64_t qs = dense_rows(q) ? q.stride(0) : hq * head_size, ks = dense_rows(k) ? k.stride(0) : hk * head_size;
  const float* csp = cs.data_ptr<float>();
  const bf16 *qp = q.data_ptr<bf16>(), *kp = k.data_ptr<bf16>();
  bf16 *qop = qo.data_ptr<bf16>(), *kop = ko.data_ptr<bf16>();
  const bool v16 = neox && (rd / 2) % 16 == 0 && has_avx512f();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
#if defined(__x86_64__)
      if (v16) {
        rotate16(qp, qs, qop, t, hq, head_size, rd, csp + t * rd);
        rotate16(kp, ks, kop, t, hk, head_size, rd, csp + t * rd);
        continue;
      }
#endif
      rotate(qp, qs, qop, t, hq, head_size, rd, csp + t * rd, neox);
      rotate(kp, ks, kop, t, hk, head_size, rd, csp + t * rd, neox);
    }
  });
  return {qo, ko};
}

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) { m.impl("rope_qk", &rope_qk_cpu); }

}  // namespace sglang_dflash
