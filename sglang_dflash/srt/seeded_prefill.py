"""Seeded requests' first token: drawn by our keyed rule, from the logits SGLang's sampler received.

SGLang's sampler overwrites next_token_logits with probabilities, in place, so the logits must be
kept before it runs (a forward pre-hook on the sampler module), and only for batches that need it.
"""

from __future__ import annotations

import torch

from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens


class PreSampleLogits:
    """Keeps a copy of the logits the target's sampler is given, while armed."""

    def __init__(self, sampler: torch.nn.Module):
        self.armed, self.logits = False, None
        sampler.register_forward_pre_hook(self._keep)

    def _keep(self, sampler, args):
        if self.armed:
            self.logits = args[0].next_token_logits.clone()

    def take(self) -> torch.Tensor:
        logits, self.logits = self.logits, None
        if logits is None:
            raise RuntimeError("DFLASH prefill: the target's sampler did not run on a seeded batch")
        return logits


def reseed_first_tokens(logits: torch.Tensor, sampling: SamplingRows, out, return_logprob: bool) -> None:
    """logits [bs, V] before sampling; out: the prefill's GenerationBatchResult, fixed in place so
    seeded rows carry the token of the (seed, position) rule verify uses, and its logprob."""
    tokens = target_tokens(logits, 1, sampling).view(-1).to(out.next_token_ids.dtype)
    seeded = torch.tensor([s is not None for s in sampling.seeds], device=tokens.device)
    out.next_token_ids = torch.where(seeded, tokens, out.next_token_ids)
    lo = out.logits_output
    if return_logprob and lo.next_token_logprobs is not None:
        temps = sampling.temperatures.clamp_min(1e-6)[:, None].to(logits.device)
        greedy = (sampling.temperatures <= 0)[:, None].to(logits.device)
        logp = torch.log_softmax(torch.where(greedy, logits.float(), logits.float() / temps), dim=-1)
        mine = logp.gather(1, tokens.long()[:, None]).squeeze(1).to(lo.next_token_logprobs.dtype)
        lo.next_token_logprobs = torch.where(seeded, mine, lo.next_token_logprobs)
