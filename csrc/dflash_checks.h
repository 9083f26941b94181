// Argument checks shared by the CPU (dflash_ops.cpp) and CUDA (dflash_ops_cuda.cu) ops, so both
// paths validate identically: shapes, dtypes, devices, contiguity, and slot / position bounds.
// Host-only code (no device functions): include it from .cpp and .cu alike.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace sglang_dflash {
namespace checks {

// k, v [L, T, Hkv, D]; k_norm_weight [L, D]; cos_sin_cache float32 [P, D]; positions, slots int64 [T];
// k_cache, v_cache [L, S, Hkv, D]; every tensor on k's device.
inline void check_write_draft_kv_args(const at::Tensor& k, const at::Tensor& v, const at::Tensor& w,
                                      const at::Tensor& cs, const at::Tensor& pos, const at::Tensor& slots,
                                      const at::Tensor& kc, const at::Tensor& vc) {
  for (const at::Tensor* t : {&v, &w, &cs, &pos, &slots, &kc, &vc})
    TORCH_CHECK(t->device() == k.device(), "write_draft_kv: all tensors must be on ", k.device(), ", got one on ",
                t->device());
  TORCH_CHECK(k.dim() == 4 && v.sizes() == k.sizes(), "write_draft_kv: k, v must be [L, T, Hkv, D] alike");
  TORCH_CHECK(v.scalar_type() == k.scalar_type(), "write_draft_kv: k and v dtypes differ (", k.scalar_type(), " vs ",
              v.scalar_type(), ")");
  TORCH_CHECK(kc.dim() == 4 && vc.sizes() == kc.sizes(), "write_draft_kv: caches must be [L, S, Hkv, D] alike");
  TORCH_CHECK(vc.scalar_type() == kc.scalar_type(), "write_draft_kv: k_cache and v_cache dtypes differ (",
              kc.scalar_type(), " vs ", vc.scalar_type(), ")");
  TORCH_CHECK(kc.size(0) == k.size(0) && kc.size(2) == k.size(2) && kc.size(3) == k.size(3),
              "write_draft_kv: cache layout [L, S, Hkv, D] does not match k");
  TORCH_CHECK(w.dim() == 2 && w.size(0) == k.size(0) && w.size(1) == k.size(3),
              "write_draft_kv: k_norm_weight must be [L, D]");
  TORCH_CHECK(cs.dim() == 2 && cs.size(1) == k.size(3) && cs.scalar_type() == at::kFloat,
              "write_draft_kv: cos_sin_cache must be float32 [P, D]");
  TORCH_CHECK(k.size(3) % 2 == 0, "write_draft_kv: head_dim must be even");
  TORCH_CHECK(pos.numel() == k.size(1) && slots.numel() == k.size(1), "write_draft_kv: positions/slots must be [T]");
  TORCH_CHECK(pos.scalar_type() == at::kLong && slots.scalar_type() == at::kLong,
              "write_draft_kv: positions and slots must be int64");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && kc.is_contiguous() && vc.is_contiguous() && w.is_contiguous() &&
                  cs.is_contiguous(),
              "write_draft_kv: tensors must be contiguous");
}

// draft, target int64 [bs, B]; prefix_lens, budget int64 [bs]; stop_ids int64 [bs, S].
inline void check_linear_verify_accept_args(const at::Tensor& draft, const at::Tensor& target,
                                            const at::Tensor& prefix_lens, const at::Tensor& budget,
                                            const at::Tensor& stop_ids) {
  TORCH_CHECK(draft.dim() == 2 && target.sizes() == draft.sizes(), "linear_verify_accept: draft/target [bs, B]");
  TORCH_CHECK(stop_ids.dim() == 2 && stop_ids.size(0) == draft.size(0), "linear_verify_accept: stop_ids [bs, S]");
  TORCH_CHECK(draft.scalar_type() == at::kLong && target.scalar_type() == at::kLong &&
                  prefix_lens.scalar_type() == at::kLong && budget.scalar_type() == at::kLong &&
                  stop_ids.scalar_type() == at::kLong,
              "linear_verify_accept: all inputs must be int64");
}

// {min slot, min position, max position} on the host, for non-empty contiguous int64
// positions/slots. CPU: a scan of the data. Other devices: reductions on the device and ONE copy of
// the four values to the host (a sync with the current stream), so no kernel runs with an index
// that was not checked.
inline std::array<int64_t, 4> index_ranges(const at::Tensor& pos, const at::Tensor& slots) {
  if (slots.device().is_cpu()) {
    const int64_t* p = pos.data_ptr<int64_t>();
    const int64_t* s = slots.data_ptr<int64_t>();
    std::array<int64_t, 4> r{s[0], s[0], p[0], p[0]};
    for (int64_t t = 1; t < slots.numel(); ++t) {
      r[0] = std::min(r[0], s[t]);
      r[1] = std::max(r[1], s[t]);
    }
    for (int64_t t = 1; t < pos.numel(); ++t) {
      r[2] = std::min(r[2], p[t]);
      r[3] = std::max(r[3], p[t]);
    }
    return r;
  }
  const at::Tensor h = at::stack({slots.min(), slots.max(), pos.min(), pos.max()}).cpu();
  const int64_t* v = h.data_ptr<int64_t>();
  return {v[0], v[1], v[2], v[3]};
}

// Every slot in [0, num_slots) (the KV pool) and every position in [0, num_positions) (the rows of
// cos_sin_cache); raises naming the offending value and the bound. Call before any write.
inline void check_write_draft_kv_bounds(const at::Tensor& pos, const at::Tensor& slots, int64_t num_slots,
                                        int64_t num_positions) {
  if (slots.numel() == 0) return;
  const std::array<int64_t, 4> r = index_ranges(pos, slots);
  const int64_t bad_slot = r[0] < 0 ? r[0] : r[1];
  TORCH_CHECK(r[0] >= 0 && r[1] < num_slots, "write_draft_kv: slot ", bad_slot, " out of range [0, ", num_slots,
              "): the KV pool has ", num_slots, " slots");
  const int64_t bad_pos = r[2] < 0 ? r[2] : r[3];
  TORCH_CHECK(r[2] >= 0 && r[3] < num_positions, "write_draft_kv: position ", bad_pos, " out of range [0, ",
              num_positions, "): cos_sin_cache has ", num_positions, " rows");
}

}  // namespace checks
}  // namespace sglang_dflash
