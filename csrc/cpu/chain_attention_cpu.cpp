// chain_attention on CPU: B query rows per request over its paged KV (the target's verify chain,
// causal; the drafter's block, not causal) in one pass per (request, KV head), reading each key and
// value row once through the slot table.
// The torch path (pipeline/attention.py attend_plan) copies every visible K/V row out of the pool
// (index_select) and runs SDPA on the copy; for one or a few rows per request the copy and the
// masked SDPA dominate (a width-8 step at one request spent 12 ms of 54 in attention).
// Arithmetic in float32 (bf16 inputs widened), one rounding to the output dtype.
// Reference: sglang_dflash/kernels/reference.py (chain_attention_ref).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/bf16_vec.h"
#include "cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// The kernel body passes 8-float vectors between inline helpers of this file only; the baseline
// build's warning about their (non-AVX) calling convention concerns no external interface.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace sglang_dflash {

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
namespace {
#include "cpu/chain_attention_body.h"
}  // namespace
}  // namespace avx2
#pragma GCC pop_options

namespace scalar {
namespace {
#include "cpu/chain_attention_body.h"
}  // namespace
}  // namespace scalar

#if defined(__x86_64__)
SGLANG_DFLASH_AVX512_WARNINGS_BEGIN
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16,avx2,fma")
namespace avx512 {
namespace {
#include "cpu/chain_attention_body.h"
#include "cpu/chain_attention_dp.h"
}  // namespace
}  // namespace avx512
#pragma GCC pop_options
SGLANG_DFLASH_AVX512_WARNINGS_END
#endif

// q [bs*B, H, D]; k_cache, v_cache [S, Hkv, D] (q's dtype: float32 or bfloat16); slots [bs, T] int64
// slot ids by position; prefix [bs] int64 committed lengths (prefix + B <= T). Row r of request i sees
// positions 0 .. prefix[i] + r when causal (its own block row included: K/V are written before
// attention), else all of 0 .. prefix[i] + B - 1.
at::Tensor chain_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                               const at::Tensor& slots, const at::Tensor& prefix, double scale, bool causal) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(),
              "chain_attention: q must be [N, H, D] and k_cache, v_cache [S, Hkv, D] alike, got ", q.sizes(), ", ",
              k_cache.sizes(), ", ", v_cache.sizes());
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "chain_attention: q, k_cache and v_cache must share one dtype, float32 or bfloat16, got ",
              q.scalar_type(), ", ", k_cache.scalar_type(), ", ", v_cache.scalar_type());
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2), S = k_cache.size(0), Hkv = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D && Hkv > 0 && H % Hkv == 0, "chain_attention: head dim ", k_cache.size(2), " vs ", D,
              " or heads ", H, " not a multiple of KV heads ", Hkv);
  TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == at::kLong && prefix.dim() == 1 &&
                  prefix.scalar_type() == at::kLong && prefix.size(0) == slots.size(0),
              "chain_attention: slots must be [bs, T] int64 and prefix [bs] int64, got ", slots.sizes(), " ",
              slots.scalar_type(), ", ", prefix.sizes(), " ", prefix.scalar_type());
  const int64_t bs = slots.size(0), T = slots.size(1);
  TORCH_CHECK(bs > 0 ? N % bs == 0 : N == 0, "chain_attention: ", N, " query rows for ", bs, " requests");
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
  if (N == 0) return out;
  const int64_t B = N / bs;
  const at::Tensor sl = slots.contiguous(), pre = prefix.contiguous();
  const int64_t *sp = sl.data_ptr<int64_t>(), *pp = pre.data_ptr<int64_t>();
  for (int64_t i = 0; i < bs; ++i) {  // bounds once, so the kernel reads only valid rows
    TORCH_CHECK(pp[i] >= 0 && pp[i] + B <= T, "chain_attention: request ", i, " prefix ", pp[i], " + ", B, " rows > ",
                T, " slot columns");
    for (int64_t j = 0; j < pp[i] + B; ++j)
      TORCH_CHECK(sp[i * T + j] >= 0 && sp[i * T + j] < S, "chain_attention: slot ", sp[i * T + j],
                  " outside the cache's ", S, " rows");
  }
  const at::Tensor qc = q.contiguous(), kc = k_cache.contiguous(), vc = v_cache.contiguous();
  const float sc = static_cast<float>(scale);
  const bool avx = has_avx2_fma();
  // Head dim 64 with more than 4 query rows a (request, KV head) (a 4-row verify's 12 at 3 query heads a
  // KV head): 6 rows a pass, so 12 rows walk the keys twice, not three times (the registers hold 6).
  [[maybe_unused]] const bool wide = B * (H / Hkv) > 4;
  // bf16 on native bf16 dot products where the CPU has them (head dims of 32, 64, 128)
  [[maybe_unused]] const bool dp =
      has_avx512_bf16() && q.scalar_type() == at::kBFloat16 && (D == 32 || D == 64 || D == 128);
  // the dp kernel for this head dim and its query rows a pass (its RP), chosen once
  int64_t rp = 1;
#if defined(__x86_64__)
  auto attend = &avx512::attend_dp<4, 4>;
  if (dp)
    std::tie(attend, rp) = D == 32    ? std::pair{&avx512::attend_dp<2, 8>, int64_t{8}}
                           : D == 128 ? std::pair{&avx512::attend_dp<8, 2>, int64_t{2}}
                           : wide     ? std::pair{&avx512::attend_dp<4, 6>, int64_t{6}}
                                      : std::pair{&avx512::attend_dp<4, 4>, int64_t{4}};
#endif
  auto run = [&](auto* tag) {  // float32 or bfloat16 only (checked above): no kernel for other dtypes
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    const scalar_t *qp = qc.data_ptr<scalar_t>(), *kp = kc.data_ptr<scalar_t>(), *vp = vc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    // Units (request, KV head) cost about their key count, which differs by request: a static split
    // in two halves left one thread waiting on the other (perf, 16 served requests x 4 rows: a third
    // of the second thread's time spinning). Longest first, each thread taking the next unit left:
    // every unit still computed alone, so the same bits in any order.
    // Too few units for the threads (one request: 3 KV heads on 2 threads left one idle a third of
    // the time): on the dp path a unit splits into chunks of whole passes, each computing its rows as
    // the whole unit would.
    const int64_t threads = at::get_num_threads();
    const int64_t passes = (B * (H / Hkv) + rp - 1) / rp;
    const int64_t chunks =
        dp && threads > 1 ? std::clamp<int64_t>((4 * threads + bs * Hkv - 1) / (bs * Hkv), 1, passes) : 1;
    const int64_t per = (passes + chunks - 1) / chunks, units = bs * Hkv * chunks;
    std::vector<int64_t> order(units);
    std::iota(order.begin(), order.end(), 0);
    const auto req = [&](int64_t w) { return w / chunks / Hkv; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return pp[req(a)] > pp[req(b)]; });
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(threads, units), 1, [&](int64_t, int64_t) {
      for (int64_t k = next++; k < units; k = next++) {
        const int64_t c = order[k] % chunks, w = order[k] / chunks, i = w / Hkv;
        if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
#if defined(__x86_64__)
          if (dp) {
            attend(qp, kp, vp, sp + i * T, pp[i], B, H, Hkv, i, w % Hkv, sc, causal, op, c * per, (c + 1) * per);
            continue;
          }
#endif
        }
        if (avx)
          avx2::attend(qp, kp, vp, sp + i * T, pp[i], B, H, Hkv, D, i, w % Hkv, sc, causal, op);
        else
          scalar::attend(qp, kp, vp, sp + i * T, pp[i], B, H, Hkv, D, i, w % Hkv, sc, causal, op);
      }
    });
  };
  if (q.scalar_type() == at::kFloat)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<at::BFloat16*>(nullptr));
  return out;
}

TORCH_LIBRARY_IMPL(sglang_dflash, CPU, m) { m.impl("chain_attention", &chain_attention_cpu); }

}  // namespace sglang_dflash
