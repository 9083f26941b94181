// rms_norm on CPU for bf16 activations: SGLang's RMSNorm.forward_native (layers/layernorm.py), with
// and without the residual add, in one call instead of ~10 torch ops (each a Python dispatch: ~25 us a
// norm, 61 norms a step of the embedded target). Its rounding points are kept: the residual sum in
// fp32 rounded once to bf16 for the next layer, the variance taken by torch's own mean (the same
// reduction order, so the same bits), 1/sqrt and the two products in fp32, the output rounded once.
// Bit-identical; reference: sglang_dflash/kernels/reference.py (rms_norm_ref).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/bf16_vec.h"
#include "cpu/cpu_features.h"

#include <cmath>
#include <tuple>
#include <type_traits>

namespace sglang_dflash {

using bf16 = at::BFloat16;

namespace {

#if defined(__x86_64__)
using avx512::load_bf16;
using avx512::store_bf16;
SGLANG_DFLASH_AVX512_WARNINGS_BEGIN

// The widen loop below over n elements (a multiple of 16), 16 lanes a step.
SGLANG_DFLASH_AVX512 void widen16(const bf16* xp, const bf16* rp, bf16* rop, float* sp, float* qp, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = load_bf16(xp + i);
    if (rop) {
      v = _mm512_add_ps(v, load_bf16(rp + i));
      store_bf16(rop + i, v);
    }
    _mm512_storeu_ps(sp + i, v);
    _mm512_storeu_ps(qp + i, _mm512_mul_ps(v, v));
  }
}

// One row of the scale loop below (H a multiple of 16), a bf16 weight.
SGLANG_DFLASH_AVX512 void scale16(const float* s, float r, const bf16* w, int64_t H, bf16* o) {
  const __m512 rv = _mm512_set1_ps(r);
  for (int64_t h = 0; h < H; h += 16)
    store_bf16(o + h, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(s + h), rv), load_bf16(w + h)));
}
SGLANG_DFLASH_AVX512_WARNINGS_END
#endif

bool use_avx512(int64_t H) { return has_avx512f() && H % 16 == 0; }

}  // namespace

// x [..., H] bf16; residual: None or bf16 of x's shape; weight [H] (any float dtype) ->
// (normed [..., H] bf16, x + residual rounded to bf16 [..., H], or an empty tensor without residual).
std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "rms_norm: x must be bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: weight must be [hidden] with hidden = x's last dim ", x.size(-1), ", got ", weight.sizes());
  const bool add = residual.has_value();
  if (add) {
    TORCH_CHECK(residual->scalar_type() == at::kBFloat16 && residual->sizes() == x.sizes(),
                "rms_norm: residual must be bfloat16 of x's shape ", x.sizes(), ", got ", residual->scalar_type(), " ",
                residual->sizes());
  }
  const int64_t H = x.size(-1), T = H ? x.numel() / H : 0;
  const at::Tensor xc = x.contiguous(), rc = add ? residual->contiguous() : xc;
  // `x * weight` promotes the weight to fp32: a bf16 weight is read and widened in place (exact), any
  // other dtype converted once here.
  const bool wb16 = weight.scalar_type() == at::kBFloat16;
  const at::Tensor w = wb16 ? weight.contiguous() : weight.to(at::kFloat).contiguous();
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor sum = at::empty({T, H}, f32), sq = at::empty({T, H}, f32);
  at::Tensor res_out = add ? at::empty_like(xc) : at::empty({0}, x.options());
  at::Tensor out = at::empty_like(xc);
  const bf16 *xp = xc.data_ptr<bf16>(), *rp = rc.data_ptr<bf16>();
  float *sp = sum.data_ptr<float>(), *qp = sq.data_ptr<float>();
  bf16* rop = add ? res_out.data_ptr<bf16>() : nullptr;
  // 16 lanes a step where the CPU has AVX-512 (a served verify step normed 64 rows 61 times, ~100 us
  // each in the scalar loop; ~35 with it, the rest torch's mean and the allocations).
  const bool v16 = use_avx512(H);
#if defined(__x86_64__)
  if (v16) widen16(xp, rp, rop, sp, qp, T * H);
#endif
  for (int64_t i = 0; !v16 && i < T * H; ++i) {
    float v = static_cast<float>(xp[i]);
    if (add) {
      v += static_cast<float>(rp[i]);
      rop[i] = bf16(v);
    }
    sp[i] = v;
    qp[i] = v * v;  // pow(2) is x * x
  }
  const at::Tensor var = at::mean(sq, {-1}, /*keepdim=*/true);  // torch's reduction: x.pow(2).mean(-1)
  const float* vp = var.data_ptr<float>();
  bf16* op = out.data_ptr<bf16>();
  const float e = static_cast<float>(eps);
  const auto scale_rows = [&](const auto* wp) {
    for (int64_t t = 0; t < T; ++t) {
      const float r = 1.0f / std::sqrt(vp[t] + e);  // torch.rsqrt, correctly rounded both ways
#if defined(__x86_64__)
      if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(wp)>>, bf16>) {
        if (v16) {
          scale16(sp + t * H, r, wp, H, op + t * H);
          continue;
        }
      }
#endif
      for (int64_t h = 0; h < H; ++h) op[t * H + h] = bf16((sp[t * H + h] * r) * static_cast<float>(wp[h]));
    }
  };
  if (wb16)
    scale_rows(w.data_ptr<bf16>());
  else
    scale_rows(w.data_ptr<float>());
  return {out.view(x.sizes()), add ? res_out.view(x.sizes()) : res_out};
}

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) { m.impl("rms_norm", &rms_norm_cpu); }

}  // namespace sglang_dflash
