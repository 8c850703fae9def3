"""Lossless and speculative sampling are distributed exactly as AR sampling (a chi-square test).

A random model over a vocabulary of 8 ids generates 4 tokens after a fixed prompt. The exact
AR distribution of those 4-token outcomes (EOS may end one early) is computed from the model by
the chain rule. N rows of one batch (row i seeded seed + i, so N independent samples) decode
with the mode under test, and Pearson's chi-square goodness-of-fit test compares the counts
with N x the exact probabilities (outcomes expected fewer than 5 times pooled into one bin).
Seeds are fixed, so the test is deterministic; if the mode is exact, a seed fails it with
probability alpha = 0.001. Power: the same test, same N, rejects plain MARS sampling at tau 0.3
(not exact) in `test_the_test_has_power`; docs/lossless.md gives the power against the
deliberate bugs it was run on and the smallest deviation it detects.
"""
import math

import pytest
import torch

from conftest import make_model
from mars_core import DecodeConfig
from mars_core.generate import decode_steps

V, PAD, EOS, MASK = 8, 0, 1, 2
PROMPT = [3, 5, 4, 6, 3]
N, CHUNK, LENGTH, ALPHA = 6000, 3000, 4, 1e-3


class TinyTokenizer:
    mask_token_id, pad_token_id, eos_token_id, unk_token_id = MASK, PAD, EOS, None

    def __len__(self):
        return V


def tiny_model(seed: int, head_scale: float):
    m = make_model("llama", V, seed=seed, head_scale=head_scale)
    m.generation_config.eos_token_id = EOS
    return m


@pytest.fixture(scope="module")
def target():
    return tiny_model(0, 4.0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_model(5, 4.0)


@torch.no_grad()
def exact_ar(model, temperature: float) -> dict[tuple, float]:
    """P(outcome) of AR sampling by the chain rule; an outcome ends at EOS (excluded) or LENGTH."""
    done: dict[tuple, float] = {}
    frontier = {(): 1.0}
    for depth in range(LENGTH):
        seqs = list(frontier)
        ids = torch.tensor([PROMPT + list(s) for s in seqs])
        probs = torch.softmax(model(input_ids=ids).logits[:, -1].double() / temperature, dim=-1)
        nxt = {}
        for s, p in zip(seqs, probs.tolist()):
            for t in range(V):
                w = frontier[s] * p[t]
                if t == EOS:
                    done[s] = done.get(s, 0.0) + w
                elif depth + 1 == LENGTH:
                    done[s + (t,)] = w
                else:
                    nxt[s + (t,)] = w
        frontier = nxt
    return done


def sample(model, cfg: DecodeConfig, draft_model=None) -> list[tuple]:
    out = []
    for start in range(0, N, CHUNK):
        c = DecodeConfig(**{**cfg.__dict__, "seed": start})
        rows, steps = decode_steps(model, TinyTokenizer(), [PROMPT] * CHUNK, c, draft_model=draft_model)
        for _ in steps:
            pass
        out += [tuple(o) for o in rows.out]
        sample.stats = rows.stats
    return out


def chi_square(samples: list[tuple], exact: dict[tuple, float]) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of Pearson's test, sparse outcomes pooled."""
    assert abs(sum(exact.values()) - 1) < 1e-9
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= set(exact), "an outcome AR sampling can never produce"
    big = [o for o, p in exact.items() if p * len(samples) >= 5]
    bins = [(counts.get(o, 0), exact[o] * len(samples)) for o in big]
    rest = (len(samples) - sum(c for c, _ in bins), len(samples) * (1 - sum(exact[o] for o in big)))
    if rest[1] >= 5:
        bins.append(rest)
    stat = sum((o - e) ** 2 / e for o, e in bins)
    df = len(bins) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p


CASES = {
    "lossless": (dict(mode="lossless", block_size=4, temperature=1.0), False),
    "lossless-all-groups": (dict(mode="lossless", block_size=4, temperature=0.7, draft_groups="all"), False),
    "spec-ar-draft": (dict(mode="spec", block_size=2, tau=1.0, draft_tokens=3, temperature=0.8), True),
    "spec-mars-draft": (dict(mode="spec", block_size=1, draft_tokens=3, draft_block_size=3, draft_tau=0.3,
                             temperature=1.0), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exact_modes_sample_like_ar(target, drafter, case):
    kw, uses_draft = CASES[case]
    cfg = DecodeConfig(cache="cursor", max_new_tokens=LENGTH, **kw)
    samples = sample(target, cfg, drafter if uses_draft else None)
    stats = sample.stats
    # both the accept and the reject path must be common, or the test would test little
    assert 0.2 < stats.accepted_drafts / stats.drafted < 0.9, stats.accepted_drafts / stats.drafted
    stat, df, p = chi_square(samples, exact_ar(target, cfg.temperature))
    assert df >= 100
    assert p > ALPHA, f"{case}: chi2 = {stat:.1f} on {df} df, p = {p:.2e}"


@pytest.mark.parametrize("kw", [dict(mode="ar"), dict(mode="mars", tau=1.0, block_size=4)], ids=["ar", "mars-tau-1"])
def test_plain_sampling_follows_the_tempered_distribution(target, kw):
    """AR sampling, and MARS at the strictest tau (one token per forward), draw each token from
    softmax(logits / temperature): a temperature != 1 so that a forgotten division shows."""
    cfg = DecodeConfig(cache="cursor", max_new_tokens=LENGTH, temperature=0.6, **kw)
    stat, df, p = chi_square(sample(target, cfg), exact_ar(target, 0.6))
    assert p > ALPHA, f"chi2 = {stat:.1f} on {df} df, p = {p:.2e}"
    assert chi_square(sample(target, cfg), exact_ar(target, 1.0))[2] < 1e-6  # the test tells the two apart


def test_the_test_has_power(target):
    """Plain MARS sampling at tau 0.3 takes mask predictions unverified: the test must reject it."""
    cfg = DecodeConfig(mode="mars", tau=0.3, block_size=4, temperature=1.0, cache="cursor", max_new_tokens=LENGTH)
    samples = sample(target, cfg)
    assert any(c > 1 for step in sample.stats.accepted_per_step for c in step)
    stat, df, p = chi_square(samples, exact_ar(target, 1.0))
    assert p < 1e-6, f"chi2 = {stat:.1f} on {df} df, p = {p:.2e}"
    # and AR sampling itself passes (the exact distribution and the scorer are right)
    ar = sample(target, DecodeConfig(mode="ar", temperature=1.0, cache="cursor", max_new_tokens=LENGTH))
    assert chi_square(ar, exact_ar(target, 1.0))[2] > ALPHA
    assert not math.isnan(stat)


@pytest.mark.parametrize("draft_tau", [0.2, 0.4])
def test_mars_draft_tokens_are_drawn_from_the_recorded_q(draft_tau):
    """The verification divides by q: each draft must really be distributed as its recorded q.

    Over N draft proposals, the count of token x at draft position a must match the sum of the
    recorded q_a(x) (each draft a multinomial draw of its own q): a Pearson test per position.
    """
    from mars_core import TauControl
    from mars_core.decoding import Rows
    from mars_core.speculative import ModelDrafter
    from mars_core.verify_forward import CursorContext

    cfg = DecodeConfig(mode="spec", cache="cursor", draft_tokens=3, draft_block_size=4, draft_tau=draft_tau,
                       temperature=1.0, max_new_tokens=LENGTH)
    rows = Rows([PROMPT] * N, cfg, TauControl(1.0), [EOS], "cpu")
    draft = tiny_model(0, 8.0)  # mask predictions with top-1 probabilities of 0.4 to 0.6: some kept
    ctx = CursorContext(draft, N, 32, MASK, PAD, "cpu")
    drafts, q = ModelDrafter(ctx, rows, cfg.draft_tokens, V).propose()
    d = torch.tensor(drafts)  # (N, K)
    assert rows.stats.draft_forwards < cfg.draft_tokens  # some row kept mask predictions
    for a in range(1, cfg.draft_tokens):
        observed = torch.bincount(d[:, a], minlength=V).double()
        expected = q[:, a].double().sum(dim=0)
        keep = expected >= 5
        stat = float(((observed - expected)[keep] ** 2 / expected[keep]).sum())
        df = int(keep.sum()) - 1
        p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
        assert p > ALPHA, f"draft position {a}: chi2 = {stat:.1f} on {df} df, p = {p:.2e}"
