"""Seeded sampled requests through real servers: DFLASH draws the same distribution as plain decoding.

For one fixed prompt we send N requests, each with its own sampling_seed and max_new_tokens 2, to a
plain server and to a DFLASH server. The first token comes from the prefill (its seeded draw is
ours), the second from a verify block. Oracles, both independent of our sampling code:
- the plain server's own logprobs give the exact first-token distribution at T=1 (goodness of fit);
- the plain server's own draws (SGLang's sampler) give the first- and second-token distributions at
  every setting (two-sample chi-square test of homogeneity).
The prompt is one where the tiny target spreads its mass (perplexity ~7.5), so a distorted sampler
(e.g. softmax applied twice: nearly uniform over the 384-token vocabulary) fails with p ~ 0.
"""

import numpy as np
import pytest
from chi2 import homogeneity_p
from scipy.stats import chisquare

from sglang_dflash.testing.servers import launch, prompts

PROMPT = prompts(6, seed=3, max_len=40)[2]
N = 800
SETTINGS = {"t1": {"temperature": 1.0}, "t07-topp": {"temperature": 0.7, "top_p": 0.9}}
MIN_P = 1e-3  # a correct sampler passes at this level 999 times in 1000


def draws(srv, params, seed0):
    jobs = [{"sampling_seed": seed0 + i, "ignore_eos": True, **params} for i in range(N)]
    outs = generate_all_params(srv, jobs)
    return outs, [o["output_ids"][0] for o in outs], [o["output_ids"][1] for o in outs]


def generate_all_params(srv, jobs):
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(32) as ex:
        return list(ex.map(lambda sp: srv.generate(PROMPT, 2, **sp), jobs))


def exact_first(srv, vocab=384):
    """The target's first-token distribution at T=1 from the plain server's own logprobs."""
    r = srv.post(
        "/generate",
        {
            "input_ids": PROMPT,
            "return_logprob": True,
            "top_logprobs_num": vocab,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        },
    ).json()
    p = np.zeros(vocab)
    for lp, tok, _ in r["meta_info"]["output_top_logprobs"][0]:
        p[tok] = np.exp(lp)
    return p / p.sum()


def fit_p(seen, p):
    obs = np.bincount(seen, minlength=len(p)).astype(float)
    exp = p * len(seen)
    big = exp >= 5
    obs = np.append(obs[big], obs[~big].sum())
    exp = np.append(exp[big], exp[~big].sum())
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.fixture(scope="module")
def samples(pair):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    with launch(target, None, "float32", name="plain-distribution") as plain:
        exact = exact_first(plain)
        ref = {k: draws(plain, sp, 10_000) for k, sp in SETTINGS.items()}
    with launch(target, drafter, "float32", name="dflash-distribution") as srv:
        got = {k: draws(srv, sp, 50_000) for k, sp in SETTINGS.items()}
    return exact, ref, got


@pytest.mark.server
def test_first_token_matches_the_target_distribution(samples):
    exact, _, got = samples
    p = fit_p(got["t1"][1], exact)
    print(f"first token at T=1: goodness of fit p={p:.3g}, top token share {max(np.bincount(got['t1'][1])) / N:.2f}")
    assert p > MIN_P


@pytest.mark.server
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("position", [1, 2])
def test_tokens_match_plain_server_draws(samples, setting, position):
    _, ref, got = samples
    p = homogeneity_p(ref[setting][position], got[setting][position])
    print(f"{setting}, output token {position}: plain vs DFLASH p={p:.3g}")
    assert p > MIN_P


@pytest.mark.server
def test_second_tokens_came_from_verify_blocks(samples):
    """The second token is a verify-step draw (a bonus or an accepted draft), not a prefill one."""
    _, _, got = samples
    outs = got["t1"][0]
    assert all(o["meta_info"]["spec_verify_ct"] == 1 for o in outs)
