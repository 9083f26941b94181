"""Deliberately broken proposal / rejection rules, to prove that the distribution tests can fail.

Each rule patches one step of the DFlash 1 "draft from q" path (pipeline/draft.sample_drafts) or of
the rejection rule (pipeline/target_sampling._residual); none is ever on in serving. A served test
turns one on with SGLANG_DFLASH_DEBUG_BROKEN_RULE (plugin.py installs it in the server process); a
unit test passes monkeypatch.setattr so the patch is undone after it.
"""

from __future__ import annotations

import torch

RULES = ("q_untruncated", "q_at_t1", "residual_unclamped", "resample_from_p")


def install(rule: str, setattr_=setattr) -> None:
    from sglang_dflash.pipeline import draft, target_sampling

    if rule not in RULES:
        raise ValueError(f"unknown broken rule {rule!r}: one of {', '.join(RULES)}")
    if rule == "residual_unclamped":  # p - q may be negative: the redraw weights are no distribution
        setattr_(target_sampling, "_residual", lambda p, q: p - q)
    elif rule == "resample_from_p":  # a rejected draft is redrawn from p instead of the residual
        setattr_(target_sampling, "_residual", lambda p, q: p)
    else:
        setattr_(draft, "sample_drafts", _verified_with_another_q(draft.sample_drafts, rule))


def _verified_with_another_q(real, rule):
    """The draft is drawn from the right q, but verify is given a different one: the full-vocabulary
    softmax at the candidates (q_untruncated) or the top-K softmax at temperature 1 (q_at_t1)."""

    def sample_drafts(out, logits, temperatures, n_sampled, gumbel, to_target=lambda i: i):
        prop = real(out, logits, temperatures, n_sampled, gumbel, to_target)
        temps = temperatures.clamp_min(1e-6).float()[:, None, None]
        vals, idx = logits.float().topk(prop.q.shape[-1], dim=-1)
        if rule == "q_untruncated":
            wrong = torch.softmax(logits.float() / temps, dim=-1).gather(2, idx)
        else:
            wrong = torch.softmax(vals, dim=-1)
        point = prop.q[..., 0] == 1.0  # slots kept as a point mass (argmax drafts)
        prop.q = torch.where(point[..., None], prop.q, wrong)
        return prop

    return sample_drafts
