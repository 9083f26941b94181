// sglang_dflash ops: schemas (defined once, here) and the CPU implementations.
// References: sglang_dflash/kernels/reference.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "cpu/cpu_features.h"
#include "accept_rule.h"
#include "dflash_checks.h"

namespace sglang_dflash {

namespace {

template <typename out_t>
inline out_t store_cast(float x) {
  return static_cast<out_t>(x);
}

// One (layer, token): k_norm + RoPE on every head of K, store K and V at the slot.
template <typename in_t, typename cache_t>
void write_one(const in_t* k, const in_t* v, const float* w, const float* cos, const float* sin, cache_t* kc,
               cache_t* vc, int64_t heads, int64_t dim, double eps, bool neox, float inv_scale,
               std::vector<float>& buf) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const in_t* kh = k + h * dim;
    float ss = 0.f;
    for (int64_t d = 0; d < dim; ++d) {
      buf[d] = static_cast<float>(kh[d]);
      ss += buf[d] * buf[d];
    }
    const float r = 1.f / std::sqrt(ss / static_cast<float>(dim) + static_cast<float>(eps));
    for (int64_t d = 0; d < dim; ++d) buf[d] = buf[d] * r * w[d];
    cache_t* out = kc + h * dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const float x1 = buf[a], x2 = buf[b];
      out[a] = store_cast<cache_t>((x1 * cos[i] - x2 * sin[i]) * inv_scale);
      out[b] = store_cast<cache_t>((x2 * cos[i] + x1 * sin[i]) * inv_scale);
    }
    const in_t* vh = v + h * dim;
    cache_t* vo = vc + h * dim;
    for (int64_t d = 0; d < dim; ++d) vo[d] = store_cast<cache_t>(static_cast<float>(vh[d]) * inv_scale);
  }
}

}  // namespace

void write_draft_kv_cpu(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_norm_weight,
                        const at::Tensor& cos_sin_cache, const at::Tensor& positions, const at::Tensor& slots,
                        at::Tensor& k_cache, at::Tensor& v_cache, double eps, bool neox, double kv_scale) {
  checks::check_write_draft_kv_args(k, v, k_norm_weight, cos_sin_cache, positions, slots, k_cache, v_cache);
  const int64_t L = k.size(0), T = k.size(1), H = k.size(2), D = k.size(3), S = k_cache.size(1);
  if (T == 0) return;
  const at::Tensor pos_c = positions.contiguous(), slots_c = slots.contiguous();
  checks::check_write_draft_kv_bounds(pos_c, slots_c, S, cos_sin_cache.size(0));
  const at::Tensor w = k_norm_weight.to(at::kFloat).contiguous();
  const int64_t* pos = pos_c.data_ptr<int64_t>();
  const int64_t* slot = slots_c.data_ptr<int64_t>();
  const float* csp = cos_sin_cache.data_ptr<float>();
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  const float inv_scale = fp8 ? static_cast<float>(1.0 / kv_scale) : 1.f;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k.scalar_type(), "write_draft_kv_in", [&] {
    using in_t = scalar_t;
    auto run = [&](auto* kc0, auto* vc0) {
      using cache_t = std::remove_pointer_t<decltype(kc0)>;
      at::parallel_for(0, L * T, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> buf(D);
        for (int64_t i = begin; i < end; ++i) {
          const int64_t l = i / T, t = i % T;
          const int64_t src = (l * T + t) * H * D, dst = (l * S + slot[t]) * H * D;
          const float* cs = csp + pos[t] * D;
          write_one<in_t, cache_t>(k.data_ptr<in_t>() + src, v.data_ptr<in_t>() + src, w.data_ptr<float>() + l * D, cs,
                                   cs + D / 2, kc0 + dst, vc0 + dst, H, D, eps, neox, inv_scale, buf);
        }
      });
    };
    switch (k_cache.scalar_type()) {
      case at::kFloat: run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>()); break;
      case at::kBFloat16: run(k_cache.data_ptr<at::BFloat16>(), v_cache.data_ptr<at::BFloat16>()); break;
      case at::kHalf: run(k_cache.data_ptr<at::Half>(), v_cache.data_ptr<at::Half>()); break;
      case at::kFloat8_e4m3fn: run(k_cache.data_ptr<at::Float8_e4m3fn>(), v_cache.data_ptr<at::Float8_e4m3fn>()); break;
      default: TORCH_CHECK(false, "write_draft_kv: unsupported cache dtype ", k_cache.scalar_type());
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_verify_accept_cpu(
    const at::Tensor& draft, const at::Tensor& target, const at::Tensor& prefix_lens, const at::Tensor& budget,
    const at::Tensor& stop_ids) {
  checks::check_linear_verify_accept_args(draft, target, prefix_lens, budget, stop_ids);
  const int64_t bs = draft.size(0), B = draft.size(1), S = stop_ids.size(1);
  auto d = draft.contiguous(), tg = target.contiguous(), st = stop_ids.contiguous();
  auto accept = at::empty({bs}, draft.options()), bonus = at::empty({bs}, draft.options());
  auto commit = at::empty({bs}, draft.options()), seq = at::empty({bs}, draft.options());
  auto out = at::full({bs, B}, -1, draft.options());
  const int64_t *dp = d.data_ptr<int64_t>(), *tp = tg.data_ptr<int64_t>(), *sp = st.data_ptr<int64_t>();
  const int64_t *pp = prefix_lens.data_ptr<int64_t>(), *bp = budget.data_ptr<int64_t>();
  int64_t *ap = accept.data_ptr<int64_t>(), *op = bonus.data_ptr<int64_t>(), *cp = commit.data_ptr<int64_t>();
  int64_t *qp = seq.data_ptr<int64_t>(), *xp = out.data_ptr<int64_t>();
  at::parallel_for(0, bs, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t* ti = tp + i * B;
      const Accepted r = accept_row(dp + i * B, ti, sp + i * S, B, S, bp[i]);
      const int64_t a = r.accept, c = r.commit;
      ap[i] = a;
      op[i] = ti[c - 1];
      cp[i] = c;
      qp[i] = pp[i] + c;
      for (int64_t j = 0; j < c; ++j) xp[i * B + j] = ti[j];
    }
  });
  return {accept, bonus, commit, seq, out};
}

// (the ISA level every CPU kernel dispatches on, the CPU's own): csrc/cpu/cpu_features.h, for Python to ask
std::tuple<int64_t, int64_t> cpu_isa() { return {isa_level(), detected_isa()}; }

TORCH_LIBRARY(sglang_dflash, m) {
  m.def(
      "write_draft_kv(Tensor k, Tensor v, Tensor k_norm_weight, Tensor cos_sin_cache, Tensor positions, "
      "Tensor slots, Tensor(a!) k_cache, Tensor(b!) v_cache, float eps, bool neox, float kv_scale) -> ()");
  m.def(
      "linear_verify_accept(Tensor draft, Tensor target, Tensor prefix_lens, Tensor budget, Tensor stop_ids) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("bf16_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");  // CPU only: bf16_linear_cpu.cpp
  m.def("pack_linear(Tensor weight, int rows) -> bool");  // CPU only: packed_linear_cpu.cpp
  m.def("unpack_linears() -> int");
  m.def("packed_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  // CPU only: rope_cpu.cpp
  m.def(
      "rope_qk(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, bool neox) "
      "-> (Tensor, Tensor)");
  // CPU only: chain_attention_cpu.cpp
  m.def(
      "chain_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor prefix, float scale, "
      "bool causal) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps) -> (Tensor, Tensor)");  // CPU only
  // CPU only: llama_layer_cpu.cpp
  m.def(
      "llama_layer(Tensor h, Tensor? residual, Tensor positions, Tensor ln1, Tensor qkv_w, Tensor? qkv_b, "
      "Tensor o_w, Tensor ln2, Tensor gate_up_w, Tensor down_w, Tensor cos_sin_cache, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor out_loc, Tensor slots, Tensor prefix, int num_heads, int num_kv_heads, "
      "int head_size, float eps, float scale, bool neox, int gemm_rows) -> (Tensor, Tensor, Tensor)");
  m.def("cpu_isa() -> (int, int)");
}

// No tensor argument to dispatch on: a call with none lands here.
TORCH_LIBRARY_IMPL(sglang_dflash, CompositeExplicitAutograd, m) { m.impl("cpu_isa", &cpu_isa); }

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) {
  m.impl("write_draft_kv", &write_draft_kv_cpu);
  m.impl("linear_verify_accept", &linear_verify_accept_cpu);
  m.impl("cpu_isa", &cpu_isa);
}

}  // namespace sglang_dflash
