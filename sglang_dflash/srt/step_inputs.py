"""Read a scheduler batch once per decode step into the plain values the stages take (StepInputs).

Only attribute reads on SGLang's ScheduleBatch / Req / SamplingBatchInfo objects (no sglang import),
so the rules stay in pipeline/ (target_sampling.py, penalties.py, accept.py, grammar_mask.py) and a
decode step goes srt -> pipeline -> model -> kernels without coming back to the batch mid-step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dflash.pipeline.accept import stop_table
from sglang_dflash.pipeline.penalties import ORDER, PenaltyRows
from sglang_dflash.pipeline.target_sampling import SamplingRows, samples
from sglang_dflash.srt.request_check import max_width


def sampling_rows(batch, flashinfer_sampler: bool = False, sampled: Optional[list] = None) -> Optional[SamplingRows]:
    """None when every request is greedy. flashinfer_sampler: SGLang samples with FlashInfer
    (--sampling-backend flashinfer, its CUDA default), whose filter order SamplingRows.top_k_first keeps.
    sampled: the batch's sampled_flags when the caller has them already."""
    sinfo = batch.sampling_info
    if sinfo is None or sinfo.is_all_greedy:
        return None
    temps = sinfo.temperatures.reshape(-1).float()
    temps = torch.where(samples(temps, sinfo.top_ks.reshape(-1)), temps, 0.0)
    return SamplingRows(
        temps,
        sinfo.top_ps,
        sinfo.top_ks,
        sinfo.min_ps,
        [r.sampling_params.sampling_seed for r in batch.reqs],
        [len(r.output_ids) for r in batch.reqs],
        top_k_first=flashinfer_sampler and bool(sinfo.need_min_p_sampling),
        sampled=sampled if sampled is not None else sampled_flags(batch),
    )


def sampled_flags(batch) -> list[bool]:
    """[bs] host-side: True for requests that sample (target_sampling.samples)."""
    return [bool(samples(r.sampling_params.temperature, r.sampling_params.top_k)) for r in batch.reqs]


def _stop_ids(req, honour_ignore_eos: bool) -> set:
    sp, tok = req.sampling_params, req.tokenizer
    if honour_ignore_eos and sp.ignore_eos:
        return set()
    stops = set(sp.stop_token_ids or ()) | set(req.eos_token_ids or ())
    if tok is not None:
        if tok.eos_token_id is not None:
            stops.add(tok.eos_token_id)
        stops |= set(getattr(tok, "additional_stop_token_ids", None) or ())
    return {s for s in stops if s is not None}


def limits(batch, device):
    """Per-request token budget [bs] and stop-token table [bs, S], as SGLang's finish check sees them."""
    budget = [
        max(
            (1 << 30 if r.sampling_params.max_new_tokens is None else r.sampling_params.max_new_tokens)
            - len(r.output_ids),
            1,
        )
        for r in batch.reqs
    ]
    stops = [_stop_ids(r, honour_ignore_eos=True) for r in batch.reqs]
    return torch.tensor(budget, dtype=torch.int64, device=device), stop_table(stops, device)


_PENALIZERS = {
    "BatchedFrequencyPenalizer": "frequency",
    "BatchedPresencePenalizer": "presence",
    "BatchedRepetitionPenalizer": "repetition",
}


def penalty_order(batch) -> tuple:
    """The order plain decoding applies penalties in, in this process: SGLang's non-overlap path
    iterates its orchestrator's penalizers, built from a Python set of classes (an order that varies
    by process), so we read it from the batch rather than fix one. Our ORDER if none is found."""
    orchestrator = getattr(getattr(batch, "sampling_info", None), "penalizer_orchestrator", None)
    names = [_PENALIZERS.get(cls.__name__) for cls in getattr(orchestrator, "penalizers", {})]
    order = tuple(n for n in names if n is not None)
    return order if sorted(order) == sorted(ORDER) else ORDER


def penalty_rows(batch, vocab: int, device) -> Optional[PenaltyRows]:
    """None when no request uses penalties, min_new_tokens or logit_bias."""
    sps = [r.sampling_params for r in batch.reqs]
    freq = [float(sp.frequency_penalty or 0.0) for sp in sps]
    pres = [float(sp.presence_penalty or 0.0) for sp in sps]
    rep = [float(sp.repetition_penalty if sp.repetition_penalty is not None else 1.0) for sp in sps]
    min_new = [int(sp.min_new_tokens or 0) for sp in sps]
    biases = [sp.logit_bias for sp in sps]
    if not (any(freq) or any(pres) or any(r != 1.0 for r in rep) or any(min_new) or any(biases)):
        return None
    bias = None
    if any(biases):
        bias = torch.zeros(len(sps), vocab, device=device)
        for i, b in enumerate(biases):
            for tok, val in {int(k): v for k, v in (b or {}).items()}.items():
                bias[i, tok] = val
    f32 = dict(dtype=torch.float32, device=device)
    return PenaltyRows(
        torch.tensor(freq, **f32),
        torch.tensor(pres, **f32),
        torch.tensor(rep, **f32),
        [list(r.output_ids) for r in batch.reqs],
        torch.tensor(min_new, dtype=torch.int64, device=device),
        stop_table([_stop_ids(r, honour_ignore_eos=False) for r in batch.reqs], device),
        bias,
        penalty_order(batch),
    )


@dataclass
class StepInputs:
    """Everything one decode step reads from the scheduler's batch, read at the top of the step."""

    prefix: torch.Tensor  # [bs] committed lengths (seq_lens): the block starts here
    anchors: torch.Tensor  # [bs] the last committed token of each request: block row 0
    req_pool_indices: torch.Tensor  # [bs] each request's row of req_to_token (its KV slot ids)
    sampling: Optional[SamplingRows]  # None: every request greedy
    sampled: list[bool]  # [bs] host: the request samples (acceptance statistics per kind)
    rids: list[str]  # [bs] request ids (acceptance is kept per request too)
    verify_ct: int  # verify steps the batch's first request has taken
    penalties: Optional[PenaltyRows]  # None: no penalties, min_new_tokens or logit_bias
    grammars: Optional[list]  # [bs] grammar objects (None rows unconstrained), None: no grammar
    budget: torch.Tensor  # [bs] tokens each request may still emit
    stop_ids: torch.Tensor  # [bs, S] stop tokens, -1 padded
    return_logprob: bool
    max_width: Optional[int] = None  # the smallest width cap of the batch's requests, None: none

    @property
    def req_rows(self) -> list[tuple[str, bool]]:
        return list(zip(self.rids, self.sampled))

    @classmethod
    def from_batch(cls, batch, vocab: int, device, flashinfer_sampler: bool = False) -> "StepInputs":
        reqs = batch.reqs
        budget, stop_ids = limits(batch, device)
        sampled = sampled_flags(batch)
        return cls(
            prefix=batch.seq_lens,
            anchors=batch.spec_info.bonus_tokens,
            req_pool_indices=batch.req_pool_indices,
            sampling=sampling_rows(batch, flashinfer_sampler, sampled),
            sampled=sampled,
            rids=[r.rid for r in reqs],
            verify_ct=reqs[0].spec_verify_ct,
            penalties=penalty_rows(batch, vocab, device),
            grammars=[r.grammar for r in reqs] if batch.has_grammar else None,
            budget=budget,
            stop_ids=stop_ids,
            return_logprob=bool(batch.return_logprob),
            max_width=min((c for c in (max_width(r.sampling_params) for r in reqs) if c is not None), default=None),
        )
