"""Lossless MARS and MARS x speculative decoding against expectations written from the spec's rules.

The target (and the draft model of "spec") is a scripted model (`scripted.py`): its logits depend
only on the position being predicted and on whether a real token or a [MASK] predicts it, so
what every step must do is known without running any decoder:

- lossless (greedy): the drafts are the previous forward's mask predictions of the group that
  stands after the accepted drafts; accepted while each equals the target's AR token; the step
  emits the accepted drafts and the target's AR token after them (at most `max_accept` in all).
  With draft_groups "last" the forward carries only the group after the last draft, so a step
  that rejects one leaves the next without drafts; "all" has a group after every accept count;
  "ends" after none and after all.
- spec: the draft model proposes K tokens (its own AR predictions, or MARS blocks kept while its
  confidence passes draft_tau); the target accepts the matching prefix, emits its AR token, then
  the mask predictions of the group after the accepted drafts while their confidence passes tau
  (>=; one confidence sits exactly on tau); `max_accept` counts the drafts too.

Every step ends by the common rule (first EOS, `max_new_tokens`). The expectations check the
tokens, the tokens per step, the verified drafts per step and the draft statistics.
"""
from __future__ import annotations

import pytest

from conftest import PROMPTS
from mars_core import DecodeConfig, generate, stream
from mars_core.prompts import encode_prompt
from scripted import EDGE, Script, cut, scripted_model

B = 4
MAX_NEW = 12


def has_group(groups: str, j: int, k: int) -> bool:
    return {"last": j == k, "all": True, "ends": j in (0, k)}[groups]


def expected_lossless(s: Script, L: int, groups: str = "last", max_new: int = MAX_NEW,
                      max_accept: int | None = None) -> list[tuple[list[int], int, int]]:
    """Per step: (tokens kept, drafts accepted, drafts offered, the kept tokens' confidences)."""
    out, steps, p, drafts = [], [], L, []
    while True:
        k, j = len(drafts), 0
        while j < k and drafts[j] == s.ar(p + j)[0]:
            j += 1
        if max_accept is not None:
            j = min(j, max_accept - 1)
        emitted = drafts[:j] + [s.ar(p + j)[0]]
        conf = [s.ar(p + i)[1] for i in range(j + 1)]  # the target's confidence in each (verified drafts: its AR token)
        take, done = cut(out, emitted, s.eos, max_new)
        out += emitted[:take]
        steps.append((emitted[:take], j, k, conf[:take]))
        if done:
            return steps
        after = p + j + 1  # the group after d_j predicts the positions after the AR token
        drafts = [s.mask(after + i)[0] for i in range(B - 1)] if has_group(groups, j, k) else []
        p += j + 1


def draft_tokens(d: Script, p: int, K: int, draft_B: int, draft_tau: float) -> tuple[list[int], int]:
    """The draft model's K proposals from position p and the forwards they took."""
    drafts, forwards = [], 0
    while len(drafts) < K:
        q = p + len(drafts)
        block = [d.ar(q)[0]]
        while len(block) < draft_B and d.mask(q + len(block))[1] >= draft_tau:
            block.append(d.mask(q + len(block))[0])
        drafts += block[:K - len(drafts)]
        forwards += 1
    return drafts, forwards


def expected_spec(s: Script, d: Script, L: int, K: int, tau: float, groups: str = "last", draft_B: int = 1,
                  draft_tau: float = 0.9, max_new: int = MAX_NEW, max_accept: int | None = None):
    """Per step: (tokens kept, drafts accepted, drafts offered, confidences); and the draft forwards."""
    out, steps, p, fwd = [], [], L, 0
    while True:
        drafts, f = draft_tokens(d, p, K, draft_B, draft_tau)
        fwd += f
        j = 0
        while j < K and drafts[j] == s.ar(p + j)[0]:
            j += 1
        if max_accept is not None:
            j = min(j, max_accept - 1)
        block = [s.ar(p + j)[0]]
        if has_group(groups, j, K):
            while len(block) < B and s.mask(p + j + len(block))[1] >= tau:
                block.append(s.mask(p + j + len(block))[0])
        if max_accept is not None:
            block = block[:max_accept - j]
        emitted = drafts[:j] + block
        conf = [s.ar(p + i)[1] for i in range(j + 1)] + [s.mask(p + i)[1] for i in range(j + 1, len(emitted))]
        take, done = cut(out, emitted, s.eos, max_new)
        out += emitted[:take]
        steps.append((emitted[:take], j, K, conf[:take]))
        if done:
            return steps, fwd
        p += len(emitted)


@pytest.fixture(scope="module")
def target(tokenizer):
    return scripted_model(tokenizer, eos_every=23, ar_low=4)  # AR confidences vary: each reported one is checked


@pytest.fixture(scope="module")
def drafter(tokenizer):
    """A draft model that agrees with the target except at every 6th position and is
    unsure of its mask predictions at some positions."""
    return scripted_model(tokenizer, "llama", seed=3, eos_every=23, ar_wrong=6, ar_wrong_at=0, mask_wrong=6,
                          mask_low=3, mask_edge=None)


def lengths(tokenizer):
    return [len(encode_prompt(tokenizer, p)) for p in PROMPTS]


def check(result, want, i):
    """The decode of prompt i against its expected steps: tokens, tokens per step, confidences."""
    tokens = [t for step, *_ in want for t in step]
    assert result.token_ids[i] == tokens, (i, result.token_ids[i], tokens)
    assert result.stats.per_sequence(i) == [max(len(step), 1) for step, *_ in want], i
    assert result.confidences[i] == [c for *_, conf in want for c in conf], i


def test_the_scripts_exercise_every_case(tokenizer, target, drafter):
    """Guard: the expectations cover what the decoders must get right."""
    _, s = target
    _, d = drafter
    steps = [st for L in lengths(tokenizer) for st in expected_lossless(s, L)]
    assert {j for _, j, k, _ in steps if k} >= {0, 1, 2, 3}  # every accept count of B - 1 drafts
    assert any(k == 0 for _, _, k, _ in steps[1:])  # a rejection left a step without drafts
    sizes = [sum(len(step) for step, *_ in expected_lossless(s, L)) for L in lengths(tokenizer)]
    assert min(sizes) < MAX_NEW == max(sizes)  # an EOS ended a row early, another ran to the cap
    all_eos = [st for L in lengths(tokenizer) for st in expected_lossless(s, L)]
    assert any(step == [] for step, *_ in all_eos)  # EOS as the first token of a step
    spec = [st for L in lengths(tokenizer) for st in expected_spec(s, d, L, 4, EDGE)[0]]
    assert {j for _, j, _, _ in spec} >= {0, 1, 2, 3, 4}
    assert any(len(step) - j >= 2 for step, j, _, _ in spec)  # tau-accepted tokens after the drafts
    assert any(s.mask(p)[1] == EDGE for p in range(40))


@pytest.mark.parametrize("cache", ["none", "cursor"])
@pytest.mark.parametrize("groups", ["last", "all", "ends"])
@pytest.mark.parametrize("max_accept", [None, 1, 2])
def test_lossless_follows_the_rule(tokenizer, target, cache, groups, max_accept):
    model, s = target
    cfg = DecodeConfig(mode="lossless", block_size=B, cache=cache, draft_groups=groups,
                       max_new_tokens=MAX_NEW, max_accept=max_accept)
    want = [expected_lossless(s, L, groups, max_accept=max_accept) for L in lengths(tokenizer)]
    got = generate(model, tokenizer, PROMPTS, cfg)
    for i, w in enumerate(want):
        check(got, w, i)
    assert got.stats.drafted == sum(k for w in want for _, _, k, _ in w)
    assert got.stats.accepted_drafts == sum(j for w in want for _, j, _, _ in w)
    if max_accept is not None:
        assert max(max(got.stats.per_sequence(i)) for i in range(len(PROMPTS))) <= max_accept


@pytest.mark.parametrize("cache", ["none", "cursor"])
def test_lossless_stream_reports_verified_drafts(tokenizer, target, cache):
    model, s = target
    cfg = DecodeConfig(mode="lossless", block_size=B, cache=cache, max_new_tokens=MAX_NEW)
    for prompt, L in zip(PROMPTS[:3], lengths(tokenizer)):
        events = list(stream(model, tokenizer, prompt, cfg))
        want = expected_lossless(s, L)
        assert [e.tokens[0] for e in events] == [step for step, *_ in want]
        assert [e.verified[0] for e in events] == [min(j, len(step)) for step, j, *_ in want]  # kept ones


@pytest.mark.parametrize("cache", ["none", "cursor"])
@pytest.mark.parametrize("groups", ["last", "all", "ends"])
@pytest.mark.parametrize("K,draft_B,max_accept", [(4, 1, None), (3, 1, 2), (5, 3, None), (4, 1, 1)])
def test_spec_follows_the_rule(tokenizer, target, drafter, cache, groups, K, draft_B, max_accept):
    model, s = target
    draft, d = drafter
    cfg = DecodeConfig(mode="spec", tau=EDGE, block_size=B, cache=cache, draft_groups=groups, draft_tokens=K,
                       draft_block_size=draft_B, draft_tau=0.9, max_new_tokens=MAX_NEW, max_accept=max_accept)
    want = [expected_spec(s, d, L, K, EDGE, groups, draft_B, 0.9, max_accept=max_accept) for L in lengths(tokenizer)]
    got = generate(model, tokenizer, PROMPTS, cfg, draft_model=draft)
    for i, (w, _) in enumerate(want):
        check(got, w, i)
    assert got.stats.accepted_drafts == sum(j for w, _ in want for _, j, _, _ in w)
    alone = generate(model, tokenizer, [PROMPTS[1]], cfg, draft_model=draft)
    check(alone, want[1][0], 0)
    assert alone.stats.draft_forwards == want[1][1]


def test_spec_at_a_stricter_tau_takes_no_edge_prediction(tokenizer, target, drafter):
    """tau just above EDGE: the predictions that sit on EDGE are no longer taken."""
    model, s = target
    draft, d = drafter
    cfg = DecodeConfig(mode="spec", tau=0.51, block_size=B, cache="cursor", draft_groups="all",
                       draft_tokens=2, max_new_tokens=MAX_NEW)
    want = [expected_spec(s, d, L, 2, 0.51, "all")[0] for L in lengths(tokenizer)]
    assert want != [expected_spec(s, d, L, 2, EDGE, "all")[0] for L in lengths(tokenizer)]
    got = generate(model, tokenizer, PROMPTS, cfg, draft_model=draft)
    for i, w in enumerate(want):
        check(got, w, i)
