"""Chi-square helpers for sampled-token tests (shared by the served distribution tests)."""

import numpy as np
from scipy.stats import chi2_contingency


def homogeneity_p(a, b):
    """Two samples of token ids -> chi-square p-value that they share one distribution (tokens with
    fewer than 10 draws in all pooled into one cell, so expected counts stay large). A pooled cell
    can hide a few tokens outside the distribution's support: the callers check every token of b
    that a never drew against the support itself (unseen)."""
    keys = sorted(set(a) | set(b))
    table = np.array([[a.count(k) for k in keys], [b.count(k) for k in keys]], dtype=float)
    big = table.sum(0) >= 10
    table = np.concatenate([table[:, big], table[:, ~big].sum(1, keepdims=True)], 1)
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table).pvalue


def unseen(a, b):
    """Indices i of sample b whose token a never drew (the tokens a pooled cell could hide)."""
    seen = set(a)
    return [i for i, t in enumerate(b) if t not in seen]


def in_support(top_logprobs, token, top_k=-1, top_p=1.0, min_p=0.0) -> bool:
    """top_logprobs: the plain server's [(logprob, token_id, _), ...] over the whole vocabulary at one
    position (temperature applied, descending) -> whether SGLang's sampler can draw `token` there."""
    probs = np.exp([lp for lp, _, _ in top_logprobs])
    ids = [t for _, t, _ in top_logprobs]
    keep = np.ones(len(ids), dtype=bool)
    if top_k > 0:
        keep &= np.arange(len(ids)) < top_k
    keep &= (np.cumsum(probs) - probs) <= top_p + 1e-6
    keep &= probs >= min_p * probs[0] - 1e-9
    return token in {t for t, k in zip(ids, keep) if k}


def draws(srv, prompt, n, new, params, workers=32):
    """n unseeded outputs of `new` tokens each (eos ignored, so every output has `new` tokens)."""
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda _: srv.generate(prompt, new, ignore_eos=True, **params), range(n)))


def outside_support(plain, prompt, vocab, ref, got, pos, params):
    """Tokens of `got` (outputs) at output position pos that `ref` (the plain server's outputs) never
    drew there and that the plain server's sampler cannot draw at that prefix (its logprobs over the
    whole vocabulary), as (position, token)."""
    bad = []
    for i in unseen([o[pos] for o in ref], [o[pos] for o in got]):
        out = got[i]
        body = {
            "input_ids": prompt + out[:pos],
            "return_logprob": True,
            "top_logprobs_num": vocab,
            "sampling_params": {"max_new_tokens": 1, "temperature": params["temperature"]},
        }
        tops = plain.post("/generate", body).json()["meta_info"]["output_top_logprobs"][0]
        filters = {k: v for k, v in params.items() if k in ("top_k", "top_p", "min_p")}
        if not in_support(tops, out[pos], **filters):
            bad.append((pos, out[pos]))
    return bad
