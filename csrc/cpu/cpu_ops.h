// The CPU ops' C++ entry points, for ops that compose them (llama_layer_cpu.cpp) without a dispatcher
// call per op. Each is defined, and registered with torch, in its own file.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace sglang_dflash {
at::Tensor bf16_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
at::Tensor packed_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rope_qk_cpu(const at::Tensor& positions, const at::Tensor& query,
                                               const at::Tensor& key, const at::Tensor& cos_sin_cache,
                                               int64_t head_size, bool neox);
at::Tensor chain_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                               const at::Tensor& slots, const at::Tensor& prefix, double scale, bool causal);
}  // namespace sglang_dflash
