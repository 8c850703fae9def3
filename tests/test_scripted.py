"""Every decoder against an expectation computed without any decoder: a scripted model.

A real tiny Qwen2 runs every forward (so the caches, masks, positions and `logits_to_keep` of each
decoder are exercised), but a forward hook replaces its logits with a script (`scripted.py`) that
depends only on the absolute position being predicted and on whether a real token or a [MASK]
predicts it. So the output of a prompt of L tokens is known in advance: per step the AR token at
the next position, then the mask predictions accepted left to right while their confidence
passes tau (>=: one sits exactly on tau), cut at the first EOS and at `max_new_tokens`.
`expected` computes that with a plain loop.

The script puts EOS at positions that rows reach at different offsets inside a block, including
mid-block after accepted tokens, mask guesses that differ from the AR token, and confidences that
make rows accept 1 to B tokens per step.
"""
from __future__ import annotations

import math

import pytest
import torch

from conftest import PROMPTS
from mars_core import DecodeConfig, generate
from mars_core.prompts import encode_prompt
from scripted import EDGE, Script, cut, scripted_model

TAU = EDGE  # a confidence exactly on tau is accepted
B = 4
MAX_NEW = 10


def expected(script: Script, L: int, block: int, max_new: int = MAX_NEW, max_accept: int | None = None,
             tau: float = TAU, where=None, repeat_guard: bool = False):
    """(tokens, accepted per step) for a prompt of L tokens, with a plain loop over positions.
    `where`, a list, gets the index of the EOS inside its block (None: stopped by max_new).
    repeat_guard: a mask token equal to the token emitted just before it in the step ends the step."""
    out, steps, p = [], [], L  # p: the position of the next token
    while True:
        emitted = [script.ar(p)[0]]
        while len(emitted) < block and tau < 1 and script.mask(p + len(emitted))[1] >= tau:
            token = script.mask(p + len(emitted))[0]
            if repeat_guard and token == emitted[-1]:
                break
            emitted.append(token)
        if max_accept is not None:
            emitted = emitted[:max_accept]
        take, done = cut(out, emitted, script.eos, max_new)
        out += emitted[:take]
        steps.append(max(take, 1))
        if done:
            if where is not None:
                where.append(emitted.index(script.eos) if script.eos in emitted else None)
            return out, steps
        p += len(emitted)


@pytest.fixture(scope="module")
def scripted(tokenizer):
    # ar_low: the first prediction of a step is sometimes below tau; it is taken all the same
    return scripted_model(tokenizer, ar_low=3)


def _lengths(tokenizer, prompts, chat=True):
    return [len(encode_prompt(tokenizer, p, chat)) for p in prompts]


def test_the_script_exercises_eos_mid_block(tokenizer, scripted):
    """Guard: the expectation itself covers the cases the decoders must get right."""
    _, script = scripted
    where, lengths = [], []
    for L in _lengths(tokenizer, PROMPTS):
        toks, _ = expected(script, L, B, where=where)
        assert script.eos not in toks
        lengths.append(len(toks))
    assert sum(w is not None and w >= 2 for w in where) >= 2  # EOS after >= 2 accepted tokens of its block
    assert 0 in where  # EOS as the first prediction of a block
    assert MAX_NEW in lengths and len(set(lengths)) >= 3  # rows stop at different points, one at the cap
    steps = [expected(script, L, B)[1] for L in _lengths(tokenizer, PROMPTS)]
    assert {1, 2, 3, 4} <= {n for s in steps for n in s}  # every accept count occurs
    edge = [p for p in range(40) if script.mask(p)[1] == TAU]
    assert edge and all(script.mask(p)[0] != script.ar(p)[0] for p in range(0, 40, 7))


CASES = [("none", 16), ("sliding", 16), ("block", 4), ("block", 8), ("cursor", 16)]


@pytest.mark.parametrize("cache,cbs", CASES)
@pytest.mark.parametrize("mode,max_accept,tau", [("mars", None, TAU), ("mars", 2, TAU), ("mars", 1, TAU),
                                                  ("ar", None, TAU), ("mars", None, 1.0)])
def test_every_decoder_matches_the_scripted_expectation(tokenizer, scripted, cache, cbs, mode, max_accept, tau):
    model, script = scripted
    block = B if mode == "mars" else 1
    cfg = DecodeConfig(mode=mode, tau=tau, block_size=B, cache=cache, cache_block_size=cbs,
                       max_new_tokens=MAX_NEW, max_accept=max_accept)
    want = [expected(script, L, block, max_accept=max_accept, tau=tau) for L in _lengths(tokenizer, PROMPTS)]
    batch = generate(model, tokenizer, PROMPTS, cfg)
    for i, (toks, steps) in enumerate(want):
        assert batch.token_ids[i] == toks, (i, batch.token_ids[i], toks)
        assert batch.stats.per_sequence(i) == steps, i
        alone = generate(model, tokenizer, [PROMPTS[i]], cfg)  # batch 1: the decoders' single-row paths
        assert alone.token_ids[0] == toks and alone.stats.per_sequence(0) == steps, i
    assert batch.stats.tokens == sum(len(t) for t, _ in want)
    assert batch.stats.row_forwards == sum(len(s) for _, s in want)
    if max_accept is not None or mode == "ar" or tau == 1.0:
        assert max(max(s) for _, s in want) <= (max_accept or 1)


@pytest.fixture(scope="module")
def repeating(tokenizer):
    return scripted_model(tokenizer, ar_low=3, mask_repeat=5)


def _guarded(model, tokenizer, script, cfg, max_new=MAX_NEW):
    """Each row of a batch decode against the rule with the guard; the rule without it differs."""
    lengths = _lengths(tokenizer, PROMPTS)
    want = [expected(script, L, B, max_new=max_new, repeat_guard=True) for L in lengths]
    assert want != [expected(script, L, B, max_new=max_new) for L in lengths]  # the script makes the guard matter
    got = generate(model, tokenizer, PROMPTS, cfg)
    for i, (toks, steps) in enumerate(want):
        assert got.token_ids[i] == toks, (i, got.token_ids[i], toks)
        assert got.stats.per_sequence(i) == steps, i


@pytest.mark.parametrize("cache,cbs", CASES)
def test_the_repeat_guard_ends_a_step_at_a_mask_that_repeats(tokenizer, repeating, cache, cbs):
    model, script = repeating
    cfg = DecodeConfig(tau=TAU, block_size=B, cache=cache, cache_block_size=cbs, max_new_tokens=MAX_NEW,
                       repeat_guard=True)
    _guarded(model, tokenizer, script, cfg)


def test_the_repeat_guard_on_the_compiled_path_and_in_serving(tokenizer, repeating, monkeypatch):
    from mars_core import TauControl
    from mars_core import decode_compiled as dc
    from mars_core.serving import Batcher, Request

    model, script = repeating
    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)  # the static path, run eagerly
    cfg = DecodeConfig(tau=TAU, block_size=B, cache="cursor", compile=True, max_new_tokens=40, repeat_guard=True)
    _guarded(model, tokenizer, script, cfg, max_new=40)
    batcher = Batcher(model, tokenizer, DecodeConfig(block_size=B, repeat_guard=True), slots=2)
    ids = [encode_prompt(tokenizer, p) for p in PROMPTS]
    rids = [batcher.submit(Request(i, max_new_tokens=12, control=TauControl(TAU))) for i in ids]
    list(batcher.run())
    for rid, p in zip(rids, ids):
        toks, steps = expected(script, len(p), B, max_new=12, repeat_guard=True)
        assert batcher.done[rid].out == toks and batcher.done[rid].accepted == steps, rid


@pytest.mark.parametrize("cache", ["none", "sliding", "cursor"])
def test_chat_false_encodes_the_raw_prompt(tokenizer, scripted, cache):
    model, script = scripted
    cfg = DecodeConfig(tau=TAU, block_size=B, cache=cache, max_new_tokens=MAX_NEW)
    raw = [len(tokenizer(p)["input_ids"]) for p in PROMPTS]  # no chat template
    assert raw != _lengths(tokenizer, PROMPTS)  # the template really changes the positions
    got = generate(model, tokenizer, PROMPTS, cfg, chat=False)
    assert got.token_ids == [expected(script, L, B)[0] for L in raw]


@pytest.mark.parametrize("max_accept", [None, 2])
def test_compiled_path_across_windows_and_buckets(tokenizer, monkeypatch, max_accept):
    """The static path (run eagerly) against the rule while its attention window grows past
    CAPACITY_STEP and its batch shrinks bucket by bucket as rows reach EOS at different steps."""
    from mars_core import decode_compiled as dc

    model, long = scripted_model(tokenizer, eos_every=150)
    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)
    windows = []
    step = dc.static_step
    monkeypatch.setattr(dc, "static_step", lambda *a, **kw: windows.append((a[2].shape[0], kw["window"])) or step(*a, **kw))
    cfg = DecodeConfig(tau=TAU, block_size=B, cache="cursor", compile=True, max_new_tokens=200, max_accept=max_accept)
    got = generate(model, tokenizer, PROMPTS, cfg)
    for i, L in enumerate(_lengths(tokenizer, PROMPTS)):
        toks, steps = expected(long, L, B, max_new=200, max_accept=max_accept)
        assert got.token_ids[i] == toks, i
        assert got.stats.per_sequence(i) == steps, i
    assert {w for _, w in windows} >= {dc.CAPACITY_STEP, 2 * dc.CAPACITY_STEP}  # the window grew
    assert len({b for b, _ in windows}) >= 3  # the batch shrank through buckets


def test_serving_rows_with_their_own_tau_and_freed_slots(tokenizer, scripted):
    """Continuous batching against the rule: each request at its own tau (one on EDGE, one just
    above, AR, one taking LOW too), two slots for six requests, so later ones fill freed rows."""
    from mars_core import TauControl
    from mars_core.serving import Batcher, Request

    model, script = scripted
    taus = [TAU, 1.0, 0.51, 0.25, TAU, 1.0]
    budgets = [10, 3, 7, 10, 5, 8]
    ids = [encode_prompt(tokenizer, p) for p in PROMPTS]
    batcher = Batcher(model, tokenizer, DecodeConfig(block_size=B), slots=2)
    rids = [batcher.submit(Request(i, max_new_tokens=n, control=TauControl(t))) for i, n, t in zip(ids, budgets, taus)]
    steps = list(batcher.run())
    for rid, p, n, t in zip(rids, ids, budgets, taus):
        toks, per_step = expected(script, len(p), B, max_new=n, tau=t)
        state = batcher.done[rid]
        assert state.out == toks, (rid, t)
        assert state.accepted == per_step, rid
    assert max(s.running for s in steps) == 2
    joined = [a for s in steps for a in s.admitted]
    assert joined == rids and any(s.admitted and s.step > 0 for s in steps)  # later requests took freed rows


@pytest.mark.parametrize("cache", ["none", "cursor"])
def test_entropy_metric_accepts_a_confidence_exactly_on_tau(tokenizer, scripted, cache):
    """Entropy: accept while H <= tau. Scripted entropies are exact in float32: 0 (HIGH), 2 x
    0.5 ln 2 (EDGE, = tau here) and ln 4 (LOW), so the expectation is the probability rule's."""
    model, script = scripted
    half = torch.tensor(0.5)
    tau = float(-(half * torch.log(half)) * 2)  # the entropy of the EDGE prediction, in float32
    cfg = DecodeConfig(tau=tau, metric="entropy", block_size=B, cache=cache, max_new_tokens=MAX_NEW)
    got = generate(model, tokenizer, PROMPTS, cfg)
    want = [expected(script, L, B) for L in _lengths(tokenizer, PROMPTS)]
    assert got.token_ids == [t for t, _ in want]
    assert [got.stats.per_sequence(i) for i in range(len(PROMPTS))] == [s for _, s in want]


def test_confidences_follow_their_definitions():
    """Each metric on a distribution written by hand (not through the code under test)."""
    from mars_core.acceptance import confidence

    probs = torch.tensor([[[0.6, 0.3, 0.1]]])
    token = torch.tensor([[0]])
    assert confidence(probs, token, "probability").item() == pytest.approx(0.6)
    assert confidence(probs, token, "margin").item() == pytest.approx(0.3)
    h = -(0.6 * math.log(0.6) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1))
    assert confidence(probs, token, "entropy").item() == pytest.approx(h, rel=1e-5)
    assert confidence(probs, torch.tensor([[1]]), "probability").item() == pytest.approx(0.3)
