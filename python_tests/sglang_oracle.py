"""Independent oracle for the tests: the exact distribution SGLang 0.5.23's own sampler draws a
token from, given logits and a request's temperature / top_p / top_k / min_p. Nothing here comes
from sglang_dflash; every step is SGLang's code, so a mismatch between our verify._filter and
SGLang's sampler cannot cancel out of a test that uses this as its expectation.

Which SGLang code, and why it is what a CPU server runs:
  * Request parameters: ``SamplingParams.__post_init__`` / ``verify`` (sampling_params.py) --
    temperature < 1e-6 becomes (temperature 1, top_k 1) and top_k -1 becomes TOP_K_ALL.
  * Batch tensors and batch-wide flags as ``SamplingBatchInfo.from_schedule_batch`` builds them
    (temperatures float [N, 1], top_ps float, top_ks int32, min_ps float; is_all_greedy,
    need_top_p / need_top_k / need_min_p).
  * ``Sampler.forward`` (layers/sampler.py): all greedy -> argmax; otherwise logits are divided by
    the temperatures and turned into probs by ``sampler_softmax`` (torch.softmax on CPU), then
    ``Sampler._sample_from_probs``: with no filter in the batch, ``sampling_from_probs_torch``
    (multinomial on the probs themselves); else, for ``sampling_backend == "pytorch"``,
    ``top_k_top_p_min_p_sampling_from_probs_torch``.
  * ``--device cpu`` makes SGLang resolve ``sampling_backend="pytorch"``
    (arg_groups/platform_hook.py: handle_cpu_backends; checked by test_sampling.py), so
    ``top_k_top_p_min_p_sampling_from_probs_torch`` is THE oracle. Called with
    ``return_filtered_probs=True`` (SGLang's own hook for capturing the sampling support) it returns
    the filtered, still unnormalized weights it hands to ``torch.multinomial`` and their token ids;
    multinomial draws proportionally to those weights, so the distribution is weights / sum.
    (The flashinfer GPU backend -- top_k_renorm_prob, top_p_renorm_prob, min_p_sampling_from_probs --
    is a different code path and is NOT what this oracle models.)
"""

from __future__ import annotations

import torch

from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

install_cpu_shims()  # without a GPU, SGLang's module-level sgl_kernel imports need these stand-ins

from sglang.srt.layers.sampler import (  # noqa: E402
    sampler_softmax,
    top_k_top_p_min_p_sampling_from_probs_torch,
)
from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams  # noqa: E402

ORACLE = "sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch"


def _rows(x, n: int) -> list:
    if isinstance(x, torch.Tensor):
        x = x.reshape(-1).tolist()
    if isinstance(x, (list, tuple)):
        assert len(x) in (1, n), (len(x), n)
        return list(x) * (n if len(x) == 1 else 1)
    return [x] * n


def request_params(n: int, temperature, top_p=1.0, top_k=-1, min_p=0.0, vocab: int = 1 << 30):
    """Per-row API values (scalars or per-row) -> SGLang's normalized, verified SamplingParams."""
    cols = [_rows(v, n) for v in (temperature, top_p, top_k, min_p)]
    params = [
        SamplingParams(temperature=float(t), top_p=float(p), top_k=int(k), min_p=float(m)) for t, p, k, m in zip(*cols)
    ]
    for sp in params:
        sp.verify(vocab)
    return params


def batch_tensors(params):
    """SamplingParams rows -> (temperatures [N, 1], top_ps, top_ks, min_ps) as SamplingBatchInfo has them."""
    return (
        torch.tensor([sp.temperature for sp in params], dtype=torch.float).view(-1, 1),
        torch.tensor([sp.top_p for sp in params], dtype=torch.float),
        torch.tensor([sp.top_k for sp in params], dtype=torch.int32),
        torch.tensor([sp.min_p for sp in params], dtype=torch.float),
    )


def sglang_probs(logits: torch.Tensor, temperature, top_p=1.0, top_k=-1, min_p=0.0) -> torch.Tensor:
    """logits [N, V] (one batch) and API parameters (scalar or per row) -> [N, V] float32: the exact
    distribution SGLang's CPU sampler draws each row's token from."""
    n, vocab = logits.shape
    params = request_params(n, temperature, top_p, top_k, min_p, vocab)
    temps, top_ps, top_ks, min_ps = batch_tensors(params)
    if all(sp.top_k <= 1 for sp in params):  # is_all_greedy: argmax of the raw logits
        return torch.nn.functional.one_hot(torch.argmax(logits, -1), vocab).float()
    probs = sampler_softmax(logits.float() / temps)
    need_top_p = any(sp.top_p != 1.0 for sp in params)
    need_top_k = any(sp.top_k != TOP_K_ALL for sp in params)
    need_min_p = any(sp.min_p > 0 for sp in params)
    if not (need_top_p or need_top_k or need_min_p):  # sampling_from_probs_torch: multinomial(probs)
        return probs
    with torch.random.fork_rng(devices=[]):  # the oracle also draws a token; keep callers' RNG as is
        _, weights, token_ids, _ = top_k_top_p_min_p_sampling_from_probs_torch(
            probs, top_ks, top_ps, min_ps, need_min_p, None, None, return_filtered_probs=True
        )
    dense = torch.zeros_like(probs).scatter_(1, token_ids.long(), weights)
    return dense / dense.sum(-1, keepdim=True)


def flashinfer_probs(logits: torch.Tensor, temperature, top_p=1.0, top_k=-1, min_p=0.0) -> torch.Tensor:
    """The distribution SGLang's FlashInfer sampling backend (its CUDA default) draws from, as
    ``Sampler._sample_from_probs`` calls it: with no min-p in the batch,
    ``top_k_top_p_sampling_from_probs(..., filter_apply_order="joint")`` keeps the tokens inside both
    the top-k and the top-p nucleus of the same probs (the torch sampler's support: sglang_probs);
    with min-p anywhere in the batch, ``top_k_renorm_prob`` -> ``top_p_renorm_prob`` ->
    ``min_p_sampling_from_probs``: top-p is cut on the distribution renormalized over the top-k,
    then min-p against the row's maximum. FlashInfer cannot run here, so this follows its documented
    semantics step by step (each step a renormalized distribution); bench/checks/gpu_check compares
    the real kernels on a GPU."""
    n, vocab = logits.shape
    params = request_params(n, temperature, top_p, top_k, min_p, vocab)
    if not any(sp.min_p > 0 for sp in params):
        return sglang_probs(logits, temperature, top_p, top_k, min_p)
    temps, top_ps, top_ks, min_ps = batch_tensors(params)
    probs = torch.softmax(logits.float() / temps, dim=-1)
    out = torch.zeros_like(probs)
    for i in range(n):
        if params[i].top_k <= 1:  # greedy rows: the argmax
            out[i, probs[i].argmax()] = 1.0
            continue
        vals, idx = probs[i].sort(descending=True)
        vals = torch.where(torch.arange(vocab) < int(top_ks[i]), vals, 0.0)  # top_k_renorm_prob
        vals = vals / vals.sum()
        vals = torch.where(vals.cumsum(0) - vals > float(top_ps[i]), 0.0, vals)  # top_p_renorm_prob
        vals = vals / vals.sum()
        vals = torch.where(vals < float(min_ps[i]) * vals[0], 0.0, vals)  # min_p_sampling_from_probs
        out[i, idx] = vals / vals.sum()
    return out
