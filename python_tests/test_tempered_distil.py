"""Distillation at temperature (train/tempered_distil.py): head_loss's fused cross-entropy on
temper()'s output is CE(p_T, softmax(logits / T)) written out by hand, loss and gradient."""

import pytest
import torch

from sglang_dflash.train.head_loss import head_cross_entropy
from sglang_dflash.train.tempered_distil import temper


def _soft(n: int, v: int, k: int, g: torch.Generator):
    ids = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(n)])  # [N, K] distinct rows
    p = torch.softmax(torch.randn(n, k, generator=g) * 2, -1)
    p[0] = 0  # a row with no distribution
    return ids, p


@pytest.mark.parametrize("t", [0.7, 1.0, 1.5])
def test_tempered_loss_is_the_cross_entropy_at_temperature(t):
    g = torch.Generator().manual_seed(0)
    n, h, v, k = 6, 8, 40, 5
    head = torch.randn(v, h, generator=g, dtype=torch.float64)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    ids, p = _soft(n, v, k, g)
    targets = ids[:, 0]
    x, (ids_t, p_t) = temper(hidden, (ids, p.double()), t)
    loss = head_cross_entropy(x, head, targets, torch.ones(n), soft=(ids_t, p_t), alpha=1.0)
    loss.backward()
    got = hidden.grad.clone()

    h2 = hidden.detach().clone().requires_grad_(True)
    logq = torch.log_softmax(h2 @ head.t() / t, -1)  # [N, V]
    pt = p.double() ** (1 / t)
    pt = pt / pt.sum(-1, keepdim=True).clamp_min(1e-30)
    ce = -(pt * logq.gather(1, ids)).sum(-1)
    ce[0] = -logq[0, targets[0]]  # no distribution: the hard label alone
    want = ce.mean()
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert torch.allclose(got, h2.grad, rtol=1e-5, atol=1e-8)


def test_temper_sharpens_below_one_and_keeps_empty_rows():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.0, 0.0, 0.0]])
    hidden = torch.ones(2, 3)
    x, (_, cold) = temper(hidden, (torch.zeros(2, 3, dtype=torch.long), p), 0.5)
    assert torch.allclose(x, hidden * 2)
    assert cold[0].tolist() == pytest.approx([0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46])
    assert cold[1].tolist() == [0.0, 0.0, 0.0]
    _, (_, same) = temper(hidden, (torch.zeros(2, 3, dtype=torch.long), p), 1.0)
    assert torch.allclose(same, p)
    with pytest.raises(ValueError, match="distil-temperature"):
        temper(hidden, (torch.zeros(2, 3, dtype=torch.long), p), 0.0)


def test_tiny_training_at_temperature(tmp_path):
    """train --distil 1 --distil-temperature 0.7 on the tiny target: the trainer runs the tempered
    loss, still learns the answers, and records the temperature."""
    import json
    import os

    from train_helpers import _tiny_workdir, train_run

    from sglang_dflash.testing.tiny_models import tiny_model_cache
    from sglang_dflash.train import features

    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    features.run(wd, target, num_context_layers=1, shard_size=6, dtype=torch.float32, topk=8)
    kw = dict(num_layers=1, block_size=4, lr=1e-2, anchors=8, seqs=4, ckpt_minutes=100, resume=False)
    out = train_run(wd, target, steps=200, distil=1.0, distil_temperature=0.7, eval_anchors=40, command="t", **kw)
    # one held-out answer makes the walk tau coarse and run-to-run noisy; an
    # untrained drafter walks about 1.0, so 1.3 still tells learning from none
    assert out["loss_last"] < 0.1 * out["loss_first"] and out["best_tau"] > 1.3, out
    with open(os.path.join(wd, "train_summary.json")) as f:
        assert json.load(f)["distil_temperature"] == 0.7
