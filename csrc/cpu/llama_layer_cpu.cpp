// One Llama decoder layer of a decode / verify step on CPU, bf16, in one call: the ops the layer
// stack (cpu/llama_stack.py) called one by one from Python (about ten a layer, 10-30 us of dispatch
// each against kernels of a few us), now called from here in the same order on the same tensors:
// RMSNorm (+ residual), the QKV GEMM, rotary embedding, the KV write into SGLang's pool, the verify
// chain attention, the output GEMM, RMSNorm (+ residual), the gate/up GEMM, SiLU-and-mul (torch's
// own silu and mul on the same views SGLang's SiluAndMul.forward_native takes), the down GEMM.
// Bit-identical to that sequence; reference: sglang_dflash/kernels/reference.py (llama_layer_ref).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <optional>
#include <tuple>

#include "cpu/cpu_ops.h"

namespace sglang_dflash {

namespace {

// k [T, kv_size] (contiguous rows), v [T, kv_size] (rows at any stride) into the [S, Hkv, D] pools at
// slots loc [T]: row copies, what `k_cache[loc] = k` does (index_put_), without its ~5 us of set-up.
void write_kv(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& out_loc, const at::Tensor& k,
              const at::Tensor& v) {
  const at::Tensor loc = out_loc.to(at::kLong).contiguous();
  const int64_t T = loc.numel(), S = k_cache.size(0), row = k_cache.size(1) * k_cache.size(2);
  if (!k_cache.is_contiguous() || !v_cache.is_contiguous() || k.stride(-1) != 1 || v.stride(-1) != 1) {
    k_cache.index_put_({loc}, k.reshape({T, k_cache.size(1), k_cache.size(2)}));
    v_cache.index_put_({loc}, v.reshape({T, k_cache.size(1), k_cache.size(2)}));
    return;
  }
  const int64_t* lp = loc.data_ptr<int64_t>();
  const auto *kp = k.data_ptr<at::BFloat16>(), *vp = v.data_ptr<at::BFloat16>();
  auto *kc = k_cache.data_ptr<at::BFloat16>(), *vc = v_cache.data_ptr<at::BFloat16>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(lp[t] >= -S && lp[t] < S, "llama_layer: out_loc ", lp[t], " outside the KV pool's ", S, " slots");
    const int64_t s = lp[t] < 0 ? lp[t] + S : lp[t];  // index_put_'s negative indices count from the end
    std::memcpy(kc + s * row, kp + t * k.stride(0), row * sizeof(at::BFloat16));
    std::memcpy(vc + s * row, vp + t * v.stride(0), row * sizeof(at::BFloat16));
  }
}

}  // namespace

// h [T, hidden] bf16 (the previous layer's output; the embeddings at layer 0, residual None);
// residual [T, hidden] or None; positions [T]; weights as SGLang holds them ([out, in]; ln [hidden]);
// k_cache, v_cache [S, Hkv, D] this layer's KV pool (written at out_loc [T]); slots [bs, W'] slot ids
// by position and prefix [bs] for the chain attention (T = bs * rows); GEMMs of up to gemm_rows rows
// run bf16_linear, more oneDNN's (on the weight packed once where cpu/packed_weights.py packed it, else
// torch's linear), as cpu/cpu_linear.py routes the layers' GEMMs ->
// (h_out [T, hidden], the residual after the input norm's add (the layer input the model's aux
//  capture takes), the residual after the post-attention norm's add (the next layer's residual)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> llama_layer_cpu(
    const at::Tensor& h, const c10::optional<at::Tensor>& residual, const at::Tensor& positions, const at::Tensor& ln1,
    const at::Tensor& qkv_w, const c10::optional<at::Tensor>& qkv_b, const at::Tensor& o_w, const at::Tensor& ln2,
    const at::Tensor& gate_up_w, const at::Tensor& down_w, const at::Tensor& cos_sin_cache, at::Tensor& k_cache,
    at::Tensor& v_cache, const at::Tensor& out_loc, const at::Tensor& slots, const at::Tensor& prefix,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_size, double eps, double scale, bool neox,
    int64_t gemm_rows) {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kBFloat16, "llama_layer: h must be [T, hidden] bfloat16, got ",
              h.sizes(), " ", h.scalar_type());
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.size(1) == num_kv_heads && k_cache.size(2) == head_size &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16,
              "llama_layer: k_cache, v_cache must be [S, ", num_kv_heads, ", ", head_size, "] bfloat16, got ",
              k_cache.sizes(), " ", k_cache.scalar_type());
  const int64_t T = h.size(0), q_size = num_heads * head_size, kv_size = num_kv_heads * head_size;
  TORCH_CHECK(qkv_w.size(0) == q_size + 2 * kv_size && out_loc.numel() == T, "llama_layer: qkv weight rows ",
              qkv_w.size(0), " != ", q_size + 2 * kv_size, " or out_loc ", out_loc.numel(), " != ", T, " tokens");
  const auto gemm = [&](const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
    return T <= gemm_rows ? sglang_dflash::bf16_linear_cpu(x, w, b) : sglang_dflash::packed_linear_cpu(x, w, b);
  };
  at::Tensor x, res_mid;
  std::tie(x, res_mid) = rms_norm_cpu(h, residual, ln1, eps);
  if (!residual.has_value()) res_mid = h;  // layer 0: the embeddings are the residual stream
  const at::Tensor qkv = gemm(x, qkv_w, qkv_b);
  const at::Tensor q0 = qkv.narrow(-1, 0, q_size), k0 = qkv.narrow(-1, q_size, kv_size);
  const at::Tensor v = qkv.narrow(-1, q_size + kv_size, kv_size);
  at::Tensor q, k;
  std::tie(q, k) = rope_qk_cpu(positions, q0, k0, cos_sin_cache, head_size, neox);
  write_kv(k_cache, v_cache, out_loc, k, v);
  const at::Tensor attn =
      chain_attention_cpu(q.view({-1, num_heads, head_size}), k_cache, v_cache, slots, prefix, scale, true);
  const at::Tensor o = gemm(attn.reshape({T, q_size}), o_w, std::nullopt);
  at::Tensor x2, res_out;
  std::tie(x2, res_out) = rms_norm_cpu(o, res_mid, ln2, eps);
  const at::Tensor gu = gemm(x2, gate_up_w, std::nullopt);
  const int64_t d = gu.size(-1) / 2;
  const at::Tensor act = at::silu(gu.narrow(-1, 0, d)) * gu.narrow(-1, d, d);
  return {gemm(act, down_w, std::nullopt), res_mid, res_out};
}

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) { m.impl("llama_layer", &llama_layer_cpu); }

}  // namespace sglang_dflash
