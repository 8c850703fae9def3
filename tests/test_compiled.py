"""The static-shape cursor path (`compile=True`) against the eager cursor decoder, token for token.

Most tests run the static path with `torch.compile` switched off (the same step function,
called as is): compiling on this 2-core CPU costs tens of seconds per graph, and what the
static path changes (fixed widths, state on the device, the buffer shrinking, acceptance in the
step) is all there without the compiler. `test_compiled_with_inductor` compiles for real, once.
"""
import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, TauControl, generate, stream
from mars_core import decode_compiled as dc
from test_cursor import BATCH
from test_decoders import SETTINGS


def only(step, prefill=None):
    """A stand-in for `dc.compiled`: `step` for the step, `prefill` (default: as is) for the first
    step, neither compiled."""
    return lambda fn, mode: step if fn is dc.static_step else (prefill or fn)


@pytest.fixture
def uncompiled(monkeypatch):
    """The static path with the step run eagerly; counts the steps and the batch sizes they ran at."""
    seen = []

    def step(*args, **kw):
        seen.append(args[2].shape[0])
        return dc.static_step(*args, **kw)

    monkeypatch.setattr(dc, "compiled", only(step))
    return seen


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def confident(request, tokenizer):
    m = make_model(request.param, len(tokenizer), seed=1, head_scale=60.0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m


def both(model, tok, prompts, **kw):
    eager = generate(model, tok, prompts, DecodeConfig(cache="cursor", **kw))
    static = generate(model, tok, prompts, DecodeConfig(cache="cursor", compile=True, **kw))
    return eager, static


def same(eager, static):
    assert static.token_ids == eager.token_ids
    # attention over the whole buffer sums in another order: confidences agree to rounding
    for a, b in zip(static.confidences, eager.confidences):
        assert a == pytest.approx(b, abs=1e-5)
    assert static.stats.accepted_per_step == eager.stats.accepted_per_step
    assert static.stats.row_forwards == eager.stats.row_forwards


@pytest.mark.parametrize("metric,tau", [s for s in SETTINGS if s[1] not in (0.0, 2.0, 0.8)] + [("probability", 1.0)])
def test_static_equals_eager(confident, tokenizer, uncompiled, metric, tau):
    eager, static = both(confident, tokenizer, BATCH, tau=tau, metric=metric, block_size=4, max_new_tokens=40)
    assert any(c > 1 for step in eager.stats.accepted_per_step for c in step) or tau == 1.0
    same(eager, static)
    assert uncompiled and uncompiled[0] == len(BATCH)


def test_rows_finish_apart_and_the_batch_shrinks(confident, tokenizer, uncompiled, monkeypatch):
    """Rows stop at different steps (a second stop id): the survivors move to smaller buffers,
    the smallest bucket they fit, as soon as they fit it."""
    live = []
    counted = dc.compiled(dc.static_step, "default")

    def step(*args, **kw):
        live.append(int(args[6].sum()))  # alive (R,)
        return counted(*args, **kw)

    monkeypatch.setattr(dc, "compiled", only(step))
    eos = tokenizer.eos_token_id
    base = dict(tau=0.5, block_size=4, max_new_tokens=40)
    full = generate(confident, tokenizer, BATCH, DecodeConfig(cache="none", **base)).token_ids
    confident.generation_config.eos_token_id = [eos, full[1][5]]
    try:
        eager, static = both(confident, tokenizer, BATCH, **base)
    finally:
        confident.generation_config.eos_token_id = eos
    assert len({len(t) for t in eager.token_ids}) > 2
    same(eager, static)
    assert uncompiled[0] == 8 and len(set(uncompiled)) >= 3  # shrank at least twice
    assert all(a >= b for a, b in zip(uncompiled, uncompiled[1:]))
    assert set(uncompiled) <= {8, 6, 4, 3, 2, 1}
    # after the first static step (at the prompts' batch), every step runs at its rows' bucket
    assert [dc._bucket(n) for n in live[1:]] == uncompiled[1:]


def test_batch_buckets():
    """Powers of two and 1.5x them: few graphs, and at most a third of a bucket idles."""
    assert [dc._bucket(n) for n in range(1, 18)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 24]


def test_prefill_inputs_pad_to_a_bucket():
    """Prompt, B - 1 masks, then padding, to 32 x a batch bucket, capped at the buffer."""
    ids, n = dc._prefill_inputs([[5, 6, 7], list(range(10, 50))], 4, 99, 0, 384, "cpu")
    assert ids.shape == (2, 64) and n.tolist() == [3, 40]  # widest row 40 + 3 -> 64
    assert ids[0, :6].tolist() == [5, 6, 7, 99, 99, 99] and ids[0, 6:].eq(0).all()
    assert ids[1, :43].tolist() == list(range(10, 50)) + [99] * 3 and ids[1, 43:].eq(0).all()
    assert dc._prefill_inputs([[1] * 100], 4, 99, 0, 384, "cpu")[0].shape == (1, 128)
    assert dc._prefill_inputs([[1] * 130], 4, 99, 0, 384, "cpu")[0].shape == (1, 192)
    assert dc._prefill_inputs([[1] * 130], 4, 99, 0, 140, "cpu")[0].shape == (1, 140)


def test_first_step_is_one_static_prefill(confident, tokenizer, monkeypatch):
    """The prompts go through `static_prefill` once per decode, at a bucketed width; the model's
    key/value layout is read once (one eager forward), not per decode."""
    widths, probes = [], []

    def prefill(model, cache, ids, n, **kw):
        widths.append(tuple(ids.shape))
        return dc.static_prefill(model, cache, ids, n, **kw)

    from mars_core import static_cache
    real_forward = static_cache.cursor_forward

    def probe(*args, **kw):
        probes.append(1)
        return real_forward(*args, **kw)

    monkeypatch.setattr(dc, "compiled", only(dc.static_step, prefill))
    monkeypatch.setattr(static_cache, "cursor_forward", probe)
    dc.static_state(confident).layout = None
    for prompts in (BATCH, PROMPTS[:1]):
        eager, static = both(confident, tokenizer, prompts, tau=0.5, block_size=4, max_new_tokens=20)
        same(eager, static)
    assert [w[0] for w in widths] == [len(BATCH), 1] and all(w[1] % dc.PREFILL_STEP == 0 for w in widths)
    assert len(probes) == 1 and len(dc.static_state(confident).layout[1]) == confident.config.num_hidden_layers
    confident.to(torch.float64)  # a cast model: its layout is read again, its buffers are new
    try:
        eager, static = both(confident, tokenizer, PROMPTS[:1], tau=0.5, block_size=4, max_new_tokens=20)
        same(eager, static)
        assert len(probes) == 2 and dc.static_state(confident).layout[1][0][3] == torch.float64
    finally:
        confident.to(torch.float32)


@pytest.mark.parametrize("mode,B", [("ar", 4), ("mars", 1), ("mars", 8)])
def test_ar_mode_and_block_sizes(confident, tokenizer, uncompiled, mode, B):
    eager, static = both(confident, tokenizer, BATCH, mode=mode, tau=0.5, block_size=B, max_new_tokens=30)
    same(eager, static)


def test_attention_window_follows_the_rows(confident, tokenizer, monkeypatch):
    """A step attends over the slots the rows have reached, rounded up to CAPACITY_STEP (here 8,
    so that the window moves in a 40-token decode) times a power of two."""
    monkeypatch.setattr(dc, "CAPACITY_STEP", 8)
    windows = []

    def step(model, cache, *args, **kw):
        windows.append((kw["window"], cache.capacity))
        return dc.static_step(model, cache, *args, **kw)

    monkeypatch.setattr(dc, "compiled", only(step))
    for mode, tau, B in (("mars", 0.5, 4), ("mars", 0.0, 8), ("mars", 0.9, 2), ("ar", 1.0, 4)):
        eager, static = both(confident, tokenizer, BATCH, mode=mode, tau=tau, block_size=B, max_new_tokens=40)
        same(eager, static)
    assert len({w for w, _ in windows}) >= 3
    assert all(w in (8, 16, 32, 64, 128, cap) and w <= cap for w, cap in windows)
    assert any(w < cap for w, cap in windows)


def test_tau_one_is_greedy_ar_and_ar_mode(model, tokenizer, uncompiled):
    ar = generate(model, tokenizer, BATCH, DecodeConfig(mode="ar", cache="cursor", compile=True, max_new_tokens=20))
    mars = generate(model, tokenizer, BATCH, DecodeConfig(tau=1.0, cache="cursor", compile=True, max_new_tokens=20))
    ref = generate(model, tokenizer, BATCH, DecodeConfig(mode="ar", cache="none", max_new_tokens=20))
    assert ar.token_ids == ref.token_ids == mars.token_ids


def test_sampling_and_max_accept(confident_model, tokenizer, uncompiled):
    eager, static = both(confident_model, tokenizer, BATCH, tau=0.7, temperature=1.0, seed=3, max_new_tokens=30)
    same(eager, static)
    eager, static = both(confident_model, tokenizer, BATCH, tau=0.2, max_accept=2, max_new_tokens=30)
    same(eager, static)


def test_max_new_tokens_cuts_mid_block(confident_model, tokenizer, uncompiled):
    for n in (1, 2, 7):
        eager, static = both(confident_model, tokenizer, BATCH, tau=0.0, max_new_tokens=n)
        same(eager, static)
        assert all(len(t) <= n for t in static.token_ids)


def test_live_tau_and_stop(confident_model, tokenizer, uncompiled):
    def run(compile, stop_at):
        cfg = DecodeConfig(tau=1.0, cache="cursor", compile=compile, max_new_tokens=40)
        control, out = TauControl(1.0), []
        for ev in stream(confident_model, tokenizer, PROMPTS[1], cfg, control):
            out.append((ev.tokens[0], ev.tau))
            if ev.step == 3:
                control.tau = 0.0
            if ev.step == stop_at:
                control.stop()
        return out

    assert run(True, 99) == run(False, 99)
    stopped = run(True, 6)
    assert len(stopped) == 7 and stopped == run(False, 6)
    assert max(len(t) for t, _ in stopped[4:]) == 4


def test_buffers_are_reused_and_never_grow(confident_model, tokenizer, uncompiled):
    cfg = DecodeConfig(tau=0.5, cache="cursor", compile=True, max_new_tokens=30)
    dc.static_state(confident_model).release()
    generate(confident_model, tokenizer, PROMPTS[:2], cfg)
    pool = dc.static_state(confident_model).pool
    first = {k: [t.data_ptr() for c in v for t in c.keys] for k, v in pool.items()}
    assert all(key[1] % dc.CAPACITY_STEP == 0 for key in first)
    generate(confident_model, tokenizer, PROMPTS[2:4], cfg)  # same shapes: the same buffers
    assert {k: [t.data_ptr() for c in v for t in c.keys] for k, v in pool.items()} == first
    dc.static_state(confident_model).release()
    assert not dc.static_state(confident_model).pool


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="cursor"):
        DecodeConfig(cache="sliding", compile=True)
    with pytest.raises(ValueError, match="reduce-overhead"):
        DecodeConfig(cache="cursor", compile="fast")


def test_compiled_with_inductor(tokenizer):
    """One real compile (inductor, default mode): a batch that shrinks, MARS and AR, equal to eager."""
    m = make_model("qwen2", len(tokenizer), seed=1, head_scale=60.0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    prompts = [PROMPTS[1], PROMPTS[2]]
    for mode in ("mars", "ar"):
        eager, compiled = both(m, tokenizer, prompts, mode=mode, tau=0.5, max_new_tokens=24)
        same(eager, compiled)
    dc.static_state(m).release()


def test_tau_one_is_ar_in_bfloat16_on_every_path(tokenizer, uncompiled):
    """The real pair runs in bf16 where a CPU has it: tau = 1 must stay AR decoding token for token
    there too, eager cursor and static path alike (a Llama, as the real model)."""
    model = make_model("llama", len(tokenizer), seed=2).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    ref = generate(model, tokenizer, BATCH, DecodeConfig(mode="ar", cache="none", max_new_tokens=20))
    assert ref.stats.tokens > 0
    for kw in (dict(cache="cursor"), dict(cache="cursor", compile=True), dict(cache="sliding")):
        ar = generate(model, tokenizer, BATCH, DecodeConfig(mode="ar", max_new_tokens=20, **kw))
        mars = generate(model, tokenizer, BATCH, DecodeConfig(tau=1.0, max_new_tokens=20, **kw))
        assert ar.token_ids == ref.token_ids == mars.token_ids, kw

