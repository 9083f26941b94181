// sglang_dflash ops: CUDA implementations (schemas live in dflash_ops.cpp).
// References: sglang_dflash/kernels/reference.py.
// Only c10/ATen core headers: no cuBLAS/cuSPARSE headers are needed to build this file.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "accept_rule.h"
#include "dflash_checks.h"

namespace sglang_dflash {

namespace {

// One warp per (token, layer, head); each lane owns E = D / 32 elements of the head.
// neox: lane owns idx = lane + 32 * j, its RoPE partner idx +- D/2 is in the same lane.
// interleaved: lane owns the contiguous idx = lane * E + j, partners (2i, 2i+1) are adjacent.
template <typename in_t, typename cache_t, int E>
__global__ void write_draft_kv_kernel(const in_t* __restrict__ k, const in_t* __restrict__ v,
                                      const float* __restrict__ w, const float* __restrict__ cos_sin,
                                      const int64_t* __restrict__ pos, const int64_t* __restrict__ slots,
                                      cache_t* __restrict__ kc, cache_t* __restrict__ vc, int64_t T, int64_t S,
                                      int64_t H, float eps, bool neox, float inv_scale) {
  constexpr int D = E * 32;
  const int64_t t = blockIdx.x, l = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const float* cs = cos_sin + pos[t] * D;
  const float* wl = w + l * D;
  for (int64_t h = threadIdx.x / 32; h < H; h += blockDim.x / 32) {
    const int64_t src = ((l * T + t) * H + h) * D, dst = ((l * S + slots[t]) * H + h) * D;
    float x[E];
    int idx[E];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      idx[j] = neox ? lane + 32 * j : lane * E + j;
      x[j] = static_cast<float>(k[src + idx[j]]);
      ss += x[j] * x[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
    const float r = rsqrtf(ss / D + eps);
#pragma unroll
    for (int j = 0; j < E; ++j) x[j] *= r * wl[idx[j]];
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const int i = idx[j];
      // first element of each rotated pair writes both outputs
      const bool first = neox ? (i < D / 2) : (i % 2 == 0);
      if (!first) continue;
      const int jp = neox ? j + E / 2 : j + 1;  // partner's slot in this lane
      const int f = neox ? i : i / 2;
      const float c = cs[f], s = cs[D / 2 + f];
      const float x1 = x[j], x2 = x[jp];
      kc[dst + i] = cache_t((x1 * c - x2 * s) * inv_scale);
      kc[dst + idx[jp]] = cache_t((x2 * c + x1 * s) * inv_scale);
    }
#pragma unroll
    for (int j = 0; j < E; ++j) vc[dst + idx[j]] = cache_t(static_cast<float>(v[src + idx[j]]) * inv_scale);
  }
}

template <typename in_t, typename cache_t>
void launch_write(const at::Tensor& k, const at::Tensor& v, const at::Tensor& w, const at::Tensor& cs,
                  const at::Tensor& pos, const at::Tensor& slots, at::Tensor& kc, at::Tensor& vc, double eps, bool neox,
                  float inv_scale) {
  const int64_t L = k.size(0), T = k.size(1), H = k.size(2), D = k.size(3), S = kc.size(1);
  const dim3 grid(T, L);
  const int threads = 32 * static_cast<int>(std::min<int64_t>(H, 8));
  auto stream = c10::cuda::getCurrentCUDAStream();
#define DFLASH_LAUNCH(E_)                                                                                          \
  write_draft_kv_kernel<in_t, cache_t, E_><<<grid, threads, 0, stream>>>(                                          \
      k.data_ptr<in_t>(), v.data_ptr<in_t>(), w.data_ptr<float>(), cs.data_ptr<float>(), pos.data_ptr<int64_t>(),  \
      slots.data_ptr<int64_t>(), kc.data_ptr<cache_t>(), vc.data_ptr<cache_t>(), T, S, H, static_cast<float>(eps), \
      neox, inv_scale)
  switch (D) {
    case 64: DFLASH_LAUNCH(2); break;
    case 128: DFLASH_LAUNCH(4); break;
    case 256: DFLASH_LAUNCH(8); break;
    default: TORCH_CHECK(false, "write_draft_kv (CUDA): head_dim must be 64, 128 or 256, got ", D);
  }
#undef DFLASH_LAUNCH
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

__global__ void accept_kernel(const int64_t* __restrict__ draft, const int64_t* __restrict__ target,
                              const int64_t* __restrict__ prefix, const int64_t* __restrict__ budget,
                              const int64_t* __restrict__ stops, int64_t bs, int64_t B, int64_t S, int64_t* accept,
                              int64_t* bonus, int64_t* commit, int64_t* seq, int64_t* out) {
  const int64_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= bs) return;
  const int64_t* t = target + i * B;
  const Accepted r = accept_row(draft + i * B, t, stops + i * S, B, S, budget[i]);
  const int64_t a = r.accept, c = r.commit;
  accept[i] = a;
  bonus[i] = t[c - 1];
  commit[i] = c;
  seq[i] = prefix[i] + c;
  for (int64_t j = 0; j < B; ++j) out[i * B + j] = j < c ? t[j] : -1;
}

}  // namespace

void write_draft_kv_cuda(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_norm_weight,
                         const at::Tensor& cos_sin_cache, const at::Tensor& positions, const at::Tensor& slots,
                         at::Tensor& k_cache, at::Tensor& v_cache, double eps, bool neox, double kv_scale) {
  checks::check_write_draft_kv_args(k, v, k_norm_weight, cos_sin_cache, positions, slots, k_cache, v_cache);
  if (k.size(1) == 0) return;
  const c10::cuda::CUDAGuard guard(k.device());
  // Slot/position bounds are checked on the host before the launch (device min/max, one small copy
  // back): the kernel indexes the pool with slots[t] unchecked, so it never runs with a bad one.
  const at::Tensor pos = positions.contiguous(), slot = slots.contiguous();
  checks::check_write_draft_kv_bounds(pos, slot, k_cache.size(1), cos_sin_cache.size(0));
  const at::Tensor w = k_norm_weight.to(at::kFloat).contiguous();
  const at::Tensor cs = cos_sin_cache.contiguous();
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  const float inv_scale = fp8 ? static_cast<float>(1.0 / kv_scale) : 1.f;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k.scalar_type(), "write_draft_kv_cuda", [&] {
    switch (k_cache.scalar_type()) {
      case at::kFloat:
        launch_write<scalar_t, float>(k, v, w, cs, pos, slot, k_cache, v_cache, eps, neox, inv_scale);
        break;
      case at::kBFloat16:
        launch_write<scalar_t, at::BFloat16>(k, v, w, cs, pos, slot, k_cache, v_cache, eps, neox, inv_scale);
        break;
      case at::kHalf:
        launch_write<scalar_t, at::Half>(k, v, w, cs, pos, slot, k_cache, v_cache, eps, neox, inv_scale);
        break;
      case at::kFloat8_e4m3fn:
        launch_write<scalar_t, at::Float8_e4m3fn>(k, v, w, cs, pos, slot, k_cache, v_cache, eps, neox, inv_scale);
        break;
      default: TORCH_CHECK(false, "write_draft_kv: unsupported cache dtype ", k_cache.scalar_type());
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_verify_accept_cuda(
    const at::Tensor& draft, const at::Tensor& target, const at::Tensor& prefix_lens, const at::Tensor& budget,
    const at::Tensor& stop_ids) {
  checks::check_linear_verify_accept_args(draft, target, prefix_lens, budget, stop_ids);
  const c10::cuda::CUDAGuard guard(draft.device());
  const int64_t bs = draft.size(0), B = draft.size(1), S = stop_ids.size(1);
  auto d = draft.contiguous(), t = target.contiguous(), st = stop_ids.contiguous();
  auto p = prefix_lens.contiguous(), b = budget.contiguous();
  auto accept = at::empty({bs}, draft.options()), bonus = at::empty({bs}, draft.options());
  auto commit = at::empty({bs}, draft.options()), seq = at::empty({bs}, draft.options());
  auto out = at::empty({bs, B}, draft.options());
  if (bs > 0) {
    const int threads = 128;
    accept_kernel<<<(bs + threads - 1) / threads, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        d.data_ptr<int64_t>(), t.data_ptr<int64_t>(), p.data_ptr<int64_t>(), b.data_ptr<int64_t>(),
        st.data_ptr<int64_t>(), bs, B, S, accept.data_ptr<int64_t>(), bonus.data_ptr<int64_t>(),
        commit.data_ptr<int64_t>(), seq.data_ptr<int64_t>(), out.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {accept, bonus, commit, seq, out};
}

TORCH_LIBRARY_IMPL(sglang_dflash, CUDA, m) {
  m.impl("write_draft_kv", &write_draft_kv_cuda);
  m.impl("linear_verify_accept", &linear_verify_accept_cuda);
}

}  // namespace sglang_dflash
