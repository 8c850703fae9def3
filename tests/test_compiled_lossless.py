"""Lossless MARS on the static-shape path (`mode="lossless", compile=True`).

Three oracles of their own: the spec's rule, step by step, on the scripted model (expectations
from test_scripted_exact.py, written without any decoder); greedy AR decoding (`mode="ar"`) of
the bundled MARS model, token for token; and the eager lossless path's statistics (drafted and
accepted drafts, tokens per step), which the compiled step recomputes on the device.

As in test_compiled.py the static step runs uncompiled in most tests (a graph costs tens of
seconds on this CPU); `test_compiled_lossless_with_inductor` compiles for real, once.
"""
from __future__ import annotations

import os

import pytest

from conftest import PROMPTS
from mars_core import DecodeConfig, generate, load_model, stream
from mars_core.exact_step import window_step
from test_scripted_exact import B, MAX_NEW, check, expected_lossless, lengths, target  # noqa: F401

BUNDLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "models", "tiny-mars-b4")


@pytest.fixture
def static(monkeypatch):
    """The static path, its steps run as they are (not compiled); records each step's batch size."""
    from mars_core import decode_shaped
    seen = []

    def step(*args, **kw):
        seen.append(args[2].ids.shape[0])
        return window_step(*args, **kw)

    monkeypatch.setattr(decode_shaped, "compiled", lambda fn, mode: step if fn is window_step else fn)
    return seen


@pytest.mark.parametrize("max_accept", [None, 1, 2])
def test_compiled_lossless_follows_the_rule(tokenizer, target, static, max_accept):  # noqa: F811
    model, s = target
    cfg = DecodeConfig(mode="lossless", block_size=B, cache="cursor", compile=True, max_new_tokens=MAX_NEW,
                       max_accept=max_accept)
    want = [expected_lossless(s, L, "last", max_accept=max_accept) for L in lengths(tokenizer)]
    got = generate(model, tokenizer, PROMPTS, cfg)
    for i, w in enumerate(want):
        check(got, w, i)
    assert got.stats.drafted == sum(k for w in want for _, _, k, _ in w)
    assert got.stats.accepted_drafts == sum(j for w in want for _, j, _, _ in w)
    assert static and max(static) == len(PROMPTS) and min(static) < len(PROMPTS)  # it ran, and shrank


def test_compiled_lossless_stream_reports_verified_drafts(tokenizer, target, static):  # noqa: F811
    model, s = target
    cfg = DecodeConfig(mode="lossless", block_size=B, cache="cursor", compile=True, max_new_tokens=MAX_NEW)
    for prompt, L in zip(PROMPTS[:3], lengths(tokenizer)):
        events = list(stream(model, tokenizer, prompt, cfg))
        want = expected_lossless(s, L)
        assert [e.tokens[0] for e in events] == [step for step, *_ in want]
        assert [e.verified[0] for e in events] == [min(j, len(step)) for step, j, *_ in want]


@pytest.fixture(scope="module")
def bundled():
    return load_model(BUNDLED)


@pytest.mark.parametrize("batch", [1, 5])
def test_compiled_lossless_is_ar_on_the_bundled_model(bundled, static, batch):
    """Held-out problems the model answers (its drafts are mostly accepted): the output is greedy
    AR's, and every count is the eager lossless path's."""
    from tasks.synthetic import make_examples

    model, tok = bundled
    prompts = [ex["messages"][0]["content"] for ex in make_examples(batch, 7, "eval")]
    kw = dict(block_size=4, cache="cursor", max_new_tokens=96)
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **kw))
    eager = generate(model, tok, prompts, DecodeConfig(mode="lossless", **kw))
    fast = generate(model, tok, prompts, DecodeConfig(mode="lossless", compile=True, **kw))
    assert fast.token_ids == ar.token_ids == eager.token_ids
    assert fast.stats.accepted_per_step == eager.stats.accepted_per_step
    assert (fast.stats.drafted, fast.stats.accepted_drafts) == (eager.stats.drafted, eager.stats.accepted_drafts)
    assert fast.stats.tokens_per_forward > 2.5  # the drafts pay: several tokens per forward
    for a, b in zip(fast.confidences, eager.confidences):
        assert a == pytest.approx(b, abs=1e-5)


def test_compiled_lossless_in_bfloat16(static):
    """The real pair runs in bf16 where a CPU has it: there too the static lossless step must give
    greedy AR's output, token for token, with the drafts still paying (the bundled model's weights
    cast to bf16: its argmax margins exceed bf16's resolution; at exact bf16 ties a wider forward may
    pick the other token, as HF's prompt lookup does, docs/exact.md)."""
    import torch
    from tasks.synthetic import make_examples

    model, tok = load_model(BUNDLED, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    prompts = [ex["messages"][0]["content"] for ex in make_examples(5, 7, "eval")]
    kw = dict(block_size=4, cache="cursor", max_new_tokens=96)
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", cache="none", max_new_tokens=96))
    eager = generate(model, tok, prompts, DecodeConfig(mode="lossless", **kw))
    fast = generate(model, tok, prompts, DecodeConfig(mode="lossless", compile=True, **kw))
    assert fast.token_ids == ar.token_ids == eager.token_ids
    assert fast.stats.accepted_per_step == eager.stats.accepted_per_step
    assert fast.stats.tokens_per_forward > 2.5
    assert static and max(static) == 5


def test_compiled_lossless_refuses_what_it_does_not_run():
    with pytest.raises(ValueError, match="compiled lossless MARS is greedy"):
        DecodeConfig(mode="lossless", cache="cursor", compile=True, temperature=0.7)
    with pytest.raises(ValueError, match="runs eagerly"):
        DecodeConfig(mode="spec", cache="cursor", compile=True)


def test_compiled_lossless_with_inductor(bundled):
    """The real thing: torch.compile of the prefill and the lossless step (fullgraph)."""
    from tasks.synthetic import make_examples

    model, tok = bundled
    prompts = [ex["messages"][0]["content"] for ex in make_examples(2, 11, "eval")]
    kw = dict(block_size=4, cache="cursor", max_new_tokens=24)
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **kw))
    fast = generate(model, tok, prompts, DecodeConfig(mode="lossless", compile=True, **kw))
    assert fast.token_ids == ar.token_ids
