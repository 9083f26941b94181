"""Our sampling filter (top-k / top-p / min-p after temperature) against SGLang's own samplers.

The expectation always comes from sglang_oracle.py, never from our code: SGLang's torch sampler (what
a CPU server runs) and the FlashInfer order (what a CUDA server runs; on a GPU bench/checks/gpu_check
also compares with FlashInfer's kernels themselves).
"""

import itertools
import subprocess
import sys
import types

import pytest
import torch
from sglang_oracle import batch_tensors, flashinfer_probs, request_params, sglang_probs

V = 32


# ---- our filter vs SGLang's sampler (the oracle above) ---------------------------------------------
def oracle_logits(g):
    """Rows of random logits, heavily tied logits (few distinct values) and one very peaked row each."""
    rand = torch.randn(6, V, generator=g) * 2.5
    ties = torch.randint(0, 4, (6, V), generator=g).float()
    peaked = torch.randn(2, V, generator=g) * 0.1
    peaked[:, 3] += 12
    return torch.cat([rand, ties, peaked])


def ours_vs_sglang(monkeypatch, logits, params, flashinfer=False):
    """Feed SGLang's own SamplingParams through the worker's path (step_inputs.sampling_rows ->
    verify.target_tokens) and return (our distribution per row, SGLang's); our distribution is what
    target_tokens hands to verify.draw (sampled rows) or the one-hot of its token (greedy rows)."""
    import sglang_dflash.pipeline.target_sampling as verify
    from sglang_dflash.srt.step_inputs import sampling_rows

    temps, top_ps, top_ks, min_ps = batch_tensors(params)
    info = types.SimpleNamespace(
        is_all_greedy=all(sp.top_k <= 1 for sp in params),
        temperatures=temps,
        top_ps=top_ps,
        top_ks=top_ks,
        min_ps=min_ps,
        need_min_p_sampling=any(sp.min_p > 0 for sp in params),
    )
    batch = types.SimpleNamespace(
        sampling_info=info, reqs=[types.SimpleNamespace(sampling_params=sp, output_ids=[]) for sp in params]
    )
    seen, real, rows = [], verify.draw, sampling_rows(batch, flashinfer_sampler=flashinfer)
    with monkeypatch.context() as m:
        m.setattr(verify, "draw", lambda w, u: seen.append(w.clone()) or real(w, u))
        tokens = verify.target_tokens(logits, 1, rows).view(-1)
    ours = torch.nn.functional.one_hot(tokens, V).float()
    if seen:
        sampled = rows.temperatures > 0
        dist = torch.cat(seen)  # draw() runs once per row chunk
        ours[sampled] = (dist / dist.sum(-1, keepdim=True))[sampled]
    want = (flashinfer_probs if flashinfer else sglang_probs)(
        logits,
        [sp.temperature for sp in params],
        [sp.top_p for sp in params],
        [sp.top_k for sp in params],
        [sp.min_p for sp in params],
    )
    return ours, want


def tie_blind_error(ours, want, logits):
    """Max difference between two [N, V] distributions, blind only to WHICH of exactly tied tokens
    fill the last top-k places (SGLang's served path takes them by torch.topk, its oracle mode by a
    full sort; each is a valid draw of the same filtered distribution): the sorted masses must match,
    and so must the multiset of logits carrying mass (above float32 cumsum round-off, which cuts
    tails of ~1e-9 in SGLang's top-p test at top_p = 1)."""
    err = (ours.sort(-1).values - want.sort(-1).values).abs().max().item()
    for o, w, lg in zip(ours, want, logits):
        if not torch.equal(lg[o > 1e-6].sort().values, lg[w > 1e-6].sort().values):
            return float("inf")
    exact = (ours - want).abs().max(-1).values  # rows without ties at the cut must match exactly
    untied = torch.tensor([len(set(lg.tolist())) == len(lg) for lg in logits])
    return max(err, exact[untied].max().item() if bool(untied.any()) else 0.0)


GRID = list(itertools.product([1.0, 0.9, 0.5, 1e-3], [-1, 1, 2, 5, V + 3], [0.0, 0.05, 0.5, 0.99]))


@pytest.mark.parametrize("temp", [0.0, 0.25, 1.0, 1.7])
@pytest.mark.parametrize("head", [1024, 4])
def test_filter_matches_sglang_sampler(monkeypatch, temp, head):
    """Per (temperature, top_p, top_k, min_p) batch: our sampling distribution == SGLang's, exactly.
    head 4: top-p rows whose nucleus is not inside the first `head` tokens take the full sort."""
    import sglang_dflash.pipeline.target_sampling as verify

    monkeypatch.setattr(verify, "_NUCLEUS_HEAD", head)
    g = torch.Generator().manual_seed(7)
    bad = []
    for top_p, top_k, min_p in GRID:
        logits = oracle_logits(g)
        ours, want = ours_vs_sglang(monkeypatch, logits, request_params(len(logits), temp, top_p, top_k, min_p))
        err = tie_blind_error(ours, want, logits)
        if err > 1e-6:
            bad.append((top_p, top_k, min_p, err))
    assert not bad, f"T={temp}: our filter differs from SGLang's sampler at (top_p, top_k, min_p, err) {bad}"


def test_filter_matches_sglang_sampler_in_mixed_batches(monkeypatch):
    """Requests with different parameters in one batch (SGLang's need_* flags are batch-wide).
    Greedy rows (top_k 1 or temperature 0) only have to pick a maximal logit: in a batch that is not
    all greedy SGLang breaks exact ties by its descending sort (argmax in an all-greedy batch), so its
    own choice among tied maxima depends on the batch; ours is always the argmax."""
    g = torch.Generator().manual_seed(8)
    grid = [(t, *rest) for t in (0.0, 0.25, 1.0, 1.7) for rest in GRID]
    for _ in range(20):
        logits = oracle_logits(g).repeat(3, 1)
        pick = torch.randint(0, len(grid), (logits.shape[0],), generator=g).tolist()
        params = request_params(len(logits), *zip(*[grid[i] for i in pick]))
        ours, want = ours_vs_sglang(monkeypatch, logits, params)
        greedy = torch.tensor([sp.top_k <= 1 for sp in params])
        assert tie_blind_error(ours[~greedy], want[~greedy], logits[~greedy]) <= 1e-6
        best = logits[greedy].max(-1, keepdim=True).values
        for dist in (ours[greedy], want[greedy]):  # each a one-hot on a maximal logit
            assert torch.equal(dist.max(-1).values, torch.ones(len(dist))) and bool((dist.sum(-1) == 1).all())
            assert torch.equal(logits[greedy].gather(1, dist.argmax(-1, keepdim=True)), best)


def test_filter_matches_the_flashinfer_order(monkeypatch):
    """A CUDA server samples with FlashInfer: in a batch where some row uses min-p, top-p is cut after
    the top-k renormalization. Rows from the whole grid mixed in batches, some with min-p and some
    without (the order is batch-wide), then the same with no min-p anywhere (the joint order)."""
    g = torch.Generator().manual_seed(9)
    grid = [(t, *rest) for t in (0.25, 1.0, 1.7) for rest in GRID]
    differs = 0
    for no_min_p in (False, True):
        for _ in range(20):
            logits = oracle_logits(g).repeat(2, 1)
            pick = torch.randint(0, len(grid), (logits.shape[0],), generator=g).tolist()
            rows = [grid[i] for i in pick]
            rows = [(t, p, k, 0.0 if no_min_p else m) for t, p, k, m in rows]
            params = request_params(len(logits), *zip(*rows))
            ours, want = ours_vs_sglang(monkeypatch, logits, params, flashinfer=True)
            assert tie_blind_error(ours, want, logits) <= 1e-6, rows
            torch_order = sglang_probs(logits, *zip(*rows))
            differs += tie_blind_error(torch_order, want, logits) > 1e-6
    assert differs, "no batch told the FlashInfer order from the torch order: the test cannot fail"


def test_cpu_server_samples_with_the_pytorch_backend():
    """The oracle models SGLang's "pytorch" sampling backend: that is what --device cpu resolves to."""
    from sglang_dflash.testing.tiny_models import tiny_model_cache

    code = (
        "from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims; install_cpu_shims()\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "from sglang_dflash.cpu_serving import engine_kwargs\n"
        f"a = ServerArgs(model_path={str(tiny_model_cache('llama', 'float32'))!r}, **engine_kwargs())\n"
        "a.resolve_once(); print('SAMPLING_BACKEND', a.resolved_dict()['sampling_backend'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "SAMPLING_BACKEND pytorch" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
