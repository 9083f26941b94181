"""The draft step reads nothing back from the device when the caller knows which rows sample (what
a captured CUDA graph needs): draft_sampling decides from SGLang's host-side request parameters,
propose takes that as `sampled`, and the proposals equal those of the device check."""

import pytest
import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.draft import draft_sampling, propose
from sglang_dflash.pipeline.target_sampling import SamplingRows
from sglang_dflash.testing.tiny_config import tiny_cfg_dict

B, V = 4, 50
D2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


def rows(temps, seeds, sampled):
    t = torch.tensor(temps)
    return SamplingRows(t, torch.ones_like(t), torch.full_like(t, -1), torch.zeros_like(t), seeds, [0] * len(temps),
                        sampled=sampled)  # fmt: skip


def test_host_flags_decide_without_the_device():
    none = draft_sampling(rows([0.0, 0.7], [None, 5], [False, True]), None, B, "qall", "cpu")
    assert none == (None, None, 0)  # a greedy row and a seeded one: point masses, no q
    temps, noise, slots = draft_sampling(rows([0.0, 0.7], [None, None], [False, True]), None, B, "qall", "cpu")
    assert temps.tolist() == [0.0, pytest.approx(0.7)] and slots == B - 1 and noise.shape[:2] == (2, B - 1)


@pytest.mark.parametrize("dflash2", [None, D2])
@pytest.mark.parametrize("temps", [[0.0, 0.0], [0.0, 0.9]])
@torch.inference_mode()
def test_propose_with_a_host_flag_never_reads_a_device_bool(dflash2, temps):
    torch.manual_seed(0)
    cfg = parse_drafter_config(tiny_cfg_dict(block_size=B, dflash=dflash2), 4)
    model = DFlashDrafter(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    emb, head = torch.randn(V, 32), torch.randn(V, 32)
    ids = torch.tensor([[3] + [V - 1] * (B - 1), [4] + [V - 1] * (B - 1)])
    pos = torch.arange(B).repeat(2, 1) + 5
    attend = lambda layer, q, k, v: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q.transpose(0, 1), k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(0, 1),
        v.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(0, 1)).transpose(0, 1)  # fmt: skip
    t = torch.tensor(temps)
    noise = -torch.log(torch.empty(2, B - 1, 4 if dflash2 else 32).exponential_())
    args = (model, attend, lambda i: emb[i], lambda h: h @ head.t(), ids, pos, t, noise, None, 0 if dflash2 else B - 1)
    want = propose(*args)
    with pytest.MonkeyPatch.context() as mp:

        def no_sync(self):
            raise AssertionError("a device value read back on the host")

        mp.setattr(torch.Tensor, "__bool__", no_sync)
        got = propose(*args, sampled=any(x > 0 for x in temps))
    for name in ("tokens", "cand_ids", "q", "q_rows", "failed"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
