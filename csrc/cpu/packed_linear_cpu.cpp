// Target weights packed once for oneDNN, for the GEMMs wider than bf16_linear takes. torch's at::linear
// hands oneDNN the plain [out, in] weight, and oneDNN reorders it into its blocked layout on every call:
// on a 2-core Xeon with AMX (one thread, the embedded target's GEMMs a step, 2026-12-06) 40 / 52 / 72 ms
// at 16 / 64 / 128 rows against 24 / 35 / 52 packed once (torch's own mkldnn::_reorder_linear_weight,
// what inductor's freezing pass packs with), with the same result bit for bit (the same oneDNN kernel).
// A registry keyed by the weight's data pointer: pack_linear fills it, unpack_linears empties it (the
// worker re-packs after a weight update), packed_linear takes a packed weight when there is one and
// at::linear otherwise, so an unpacked weight is never wrong, only slower.
// Reference: sglang_dflash/kernels/reference.py (packed_linear_ref: F.linear).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "cpu/cpu_ops.h"

namespace sglang_dflash {

namespace {

struct Packed {
  at::Tensor weight;  // the plain weight, held so its address is not reused by another tensor while packed
  at::Tensor packed;  // oneDNN's layout (an opaque mkldnn tensor)
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const void*, Packed>& registry() {
  static std::unordered_map<const void*, Packed> r;
  return r;
}

}  // namespace

// weight [out, in] bf16 contiguous; rows: the row count oneDNN tunes the layout for -> whether it packed
// (false where this torch has no oneDNN bf16 for this CPU: GEMMs then stay at::linear's).
bool pack_linear_cpu(const at::Tensor& weight, int64_t rows) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 && weight.is_contiguous(),
              "pack_linear: weight must be a contiguous [out, in] bfloat16 tensor, got ", weight.sizes(), " ",
              weight.scalar_type());
  static const auto reorder = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "");
  torch::jit::Stack stack{weight, rows};
  try {
    reorder.callBoxed(&stack);
  } catch (const c10::Error&) {
    return false;
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[weight.data_ptr()] = {weight, stack[0].toTensor()};
  return true;
}

int64_t unpack_linears_cpu() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto n = static_cast<int64_t>(registry().size());
  registry().clear();
  return n;
}

// x [..., in], weight [out, in], bias [out] or None -> x @ weight^T + bias [..., out]: oneDNN on the
// packed weight where weight is registered (same sizes, same dtype), at::linear otherwise.
at::Tensor packed_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  at::Tensor packed;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    const auto it = registry().find(weight.data_ptr());
    if (it != registry().end() && it->second.weight.sizes() == weight.sizes() &&
        it->second.weight.scalar_type() == weight.scalar_type() && x.scalar_type() == weight.scalar_type())
      packed = it->second.packed;
  }
  if (!packed.defined() || x.dim() < 2 || x.numel() == 0) return at::linear(x, weight, bias);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x.contiguous(),
                          packed,
                          bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                          c10::IValue(std::string("none")),
                          c10::IValue(c10::List<std::optional<at::Scalar>>()),
                          c10::IValue()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) {
  m.impl("pack_linear", &pack_linear_cpu);
  m.impl("unpack_linears", &unpack_linears_cpu);
  m.impl("packed_linear", &packed_linear_cpu);
}

// No tensor argument to dispatch on: a call with none lands here.
TORCH_LIBRARY_IMPL(sglang_dflash, CompositeExplicitAutograd, m) { m.impl("unpack_linears", &unpack_linears_cpu); }

}  // namespace sglang_dflash
