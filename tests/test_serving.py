"""Continuous batching: every request equals its alone-decode, whatever joins or leaves around it."""
import random

import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, TauControl
from mars_core import serving as serving_mod
from mars_core.decode_cursor import CursorCache
from mars_core.generate import decode_steps
from mars_core.prompts import encode_prompt
from mars_core.serving import Batcher, Request
from mars_core.tau_policy import FixedTau
from test_decoders import hf_greedy

MORE = PROMPTS + ["7 + 8 = ?", "List three numbers between 10 and 20, then sort them from largest to smallest."]


class Scripted:
    """A policy that plays a fixed tau sequence, one value per forward (cycling)."""

    def __init__(self, taus, metric="probability"):
        self.taus, self.metric, self.calls = list(taus), metric, 0

    def __call__(self, load):
        self.calls += 1
        return self.taus[(self.calls - 1) % len(self.taus)]


def alone(model, tok, req: Request, taus: list[float], metric="probability", temperature=0.0, B=4):
    """Decode one request by itself with the cursor decoder, replaying its tau schedule."""
    cfg = DecodeConfig(tau=taus[0], metric=metric, block_size=B, cache="cursor", temperature=temperature,
                       seed=req.seed, max_new_tokens=req.max_new_tokens)
    control = TauControl(taus[0], metric)
    rows, steps = decode_steps(model, tok, [req.prompt_ids], cfg, control)
    for i, ev in enumerate(steps):
        assert ev.tau == taus[i]
        if i + 1 < len(taus):
            control.tau = taus[i + 1]
    return rows.out[0], rows.stats.per_sequence(0)


def serve(batcher: Batcher, arrivals: list[tuple[int, Request]]):
    """Submit each request when the batcher has done `at` forwards; run until all are done."""
    pending = sorted(arrivals, key=lambda a: a[0])
    ids, clock, steps = [], 0, []
    while pending or not batcher.idle:
        while pending and pending[0][0] <= clock:
            ids.append(batcher.submit(pending.pop(0)[1]))
        out = batcher.step()
        clock += 1
        if out is not None:
            steps.append(out)
    return ids, steps


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def confident(request, tokenizer):
    m = make_model(request.param, len(tokenizer), seed=1, head_scale=60.0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m


def _requests(tok, order, seed0=0):
    rng = random.Random(order)
    prompts = MORE[:]
    rng.shuffle(prompts)
    reqs = [Request(encode_prompt(tok, p), max_new_tokens=rng.choice([7, 20, 40]), seed=seed0 + i)
            for i, p in enumerate(prompts)]
    at = sorted(rng.sample(range(0, 12), len(reqs)))
    return list(zip(at, reqs))


@pytest.mark.parametrize("order,metric,taus", [(0, "probability", [1.0, 0.5, 0.9, 0.0, 0.7, 1.0, 1.0]),
                                               (1, "entropy", [0.0, 2.0, 0.5]), (2, "margin", [0.3, 1.0, 0.8]),
                                               (3, "probability", [0.9])])
def test_every_request_equals_its_alone_decode(confident, tokenizer, order, metric, taus):
    arrivals = _requests(tokenizer, order)
    b = Batcher(confident, tokenizer, DecodeConfig(metric=metric, block_size=4), slots=3,
                policy=Scripted(taus, metric))
    ids, steps = serve(b, arrivals)
    assert max(s.running for s in steps) == 3 and max(s.waiting for s in steps) > 0  # queued and refilled
    assert any(c > 1 for s in b.done.values() for c in s.accepted), "must exercise multi-token steps"
    for rid, (_, req) in zip(ids, arrivals):
        s = b.done[rid]
        assert len(s.taus) == len(s.accepted)
        got = alone(confident, tokenizer, req, s.taus, metric)
        assert (s.out, s.accepted) == got, rid


def test_arrival_order_does_not_change_a_request(confident, tokenizer):
    """The same requests under fixed tau, in three arrival orders and two slot counts."""
    results = []
    for order, slots in [(0, 2), (1, 4), (2, 8)]:
        arrivals = _requests(tokenizer, 0)
        rng = random.Random(order)
        at = sorted(rng.sample(range(0, 25), len(arrivals)))
        rng.shuffle(arrivals)
        arrivals = [(t, r) for t, (_, r) in zip(at, arrivals)]
        b = Batcher(confident, tokenizer, DecodeConfig(tau=0.6, block_size=4), slots=slots)
        ids, _ = serve(b, arrivals)
        results.append({tuple(r.prompt_ids): b.done[i].out for i, (_, r) in zip(ids, arrivals)})
    assert results[0] == results[1] == results[2]


def test_tau_one_equals_model_generate(model, tokenizer):
    seen = []
    orig = serving_mod.cursor_forward

    def spy(model_, cache, feed, cursor, predictions, *a):
        seen.append(predictions)
        return orig(model_, cache, feed, cursor, predictions, *a)

    arrivals = [(3 * i, Request(encode_prompt(tokenizer, p), max_new_tokens=24)) for i, p in enumerate(MORE)]
    b = Batcher(model, tokenizer, DecodeConfig(tau=1.0, block_size=4), slots=4)
    serving_mod.cursor_forward = spy
    try:
        ids, _ = serve(b, arrivals)
    finally:
        serving_mod.cursor_forward = orig
    for rid, p in zip(ids, MORE):
        assert b.done[rid].out == hf_greedy(model, tokenizer, p, 24), p
        assert set(b.done[rid].accepted) == {1}
    assert set(seen) == {1}  # all rows strict: no masks in the forward


def test_sampling_equals_alone(confident_model, tokenizer):
    arrivals = _requests(tokenizer, 5, seed0=11)
    cfg = DecodeConfig(block_size=4, temperature=1.0)
    b = Batcher(confident_model, tokenizer, cfg, slots=3, policy=Scripted([0.7, 1.0, 0.4]))
    ids, _ = serve(b, arrivals)
    for rid, (_, req) in zip(ids, arrivals):
        s = b.done[rid]
        assert (s.out, s.accepted) == alone(confident_model, tokenizer, req, s.taus, temperature=1.0), rid


def test_request_control_sets_its_tau_and_stops_it(confident_model, tokenizer):
    ids0 = encode_prompt(tokenizer, PROMPTS[1])
    pinned = TauControl(1.0)
    stopped = TauControl(0.5)
    b = Batcher(confident_model, tokenizer, DecodeConfig(block_size=4), slots=4, policy=FixedTau(0.3))
    a = b.submit(Request(ids0, max_new_tokens=40, control=pinned))
    c = b.submit(Request(ids0, max_new_tokens=40))
    d = b.submit(Request(ids0, max_new_tokens=40, control=stopped))
    for _ in range(3):
        b.step()
    stopped.stop()
    ev = b.step()
    assert any(e.request_id == d and e.finished and not e.tokens for e in ev.events)
    assert d in b.done and len(b.done[d].taus) == 3
    list(b.run())
    assert set(b.done[a].taus) == {1.0} and set(b.done[c].taus) == {0.3}
    assert b.done[a].out == alone(confident_model, tokenizer, Request(ids0, 40), [1.0] * 40)[0]
    full = alone(confident_model, tokenizer, Request(ids0, 40), [0.5] * 40)[0]
    assert full[: len(b.done[d].out)] == b.done[d].out and len(b.done[d].out) < len(full)


def test_rows_stay_in_one_buffer_at_the_top(confident_model, tokenizer):
    """Allocated once; a forward of R rows uses rows [0, R); a freed row is refilled."""
    ptrs, widths = set(), []
    orig = CursorCache.plan

    def spy(self, start, slots, length):
        ptrs.update(k.data_ptr() for k in self.keys + self.values)
        widths.append((slots.shape[0], self.batch))
        return orig(self, start, slots, length)

    CursorCache.plan = spy
    try:
        arrivals = [(0, Request(encode_prompt(tokenizer, p), max_new_tokens=n))
                    for p, n in zip(MORE, [5, 30, 9, 30, 14, 30, 3, 30])]
        b = Batcher(confident_model, tokenizer, DecodeConfig(tau=0.5, block_size=4), slots=3)
        serve(b, arrivals)
    finally:
        CursorCache.plan = orig
    assert len(ptrs) == 2 * confident_model.config.num_hidden_layers  # keys + values, never reallocated
    assert all(batch == 3 and rows <= 3 for rows, batch in widths)
    assert len(b.done) == len(MORE)


def test_eos_and_max_new_tokens_per_request(model, tokenizer):
    eos = tokenizer.eos_token_id
    ref = {p: hf_greedy(model, tokenizer, p, 12) for p in MORE}
    model.generation_config.eos_token_id = [eos] + [t[2] for t in ref.values() if len(t) > 2]
    try:
        arrivals = [(i, Request(encode_prompt(tokenizer, p), max_new_tokens=12 - i)) for i, p in enumerate(MORE)]
        b = Batcher(model, tokenizer, DecodeConfig(tau=1.0), slots=3)
        ids, _ = serve(b, arrivals)
        for rid, (i, req), p in zip(ids, arrivals, MORE):
            got = b.done[rid].out
            assert len(got) <= min(2, 12 - i) and ref[p][: len(got)] == got
    finally:
        model.generation_config.eos_token_id = eos


def test_bad_requests_are_refused(model, tokenizer):
    b = Batcher(model, tokenizer, DecodeConfig(), slots=2, max_len=64)
    for bad, msg in [(Request([]), "non-empty"), (Request([1, 2], max_new_tokens=0), "max_new_tokens"),
                     (Request([1] * 40, max_new_tokens=30), "positions"), ("hi", "Request"),
                     (Request([1], 8, control=TauControl(0.5, "entropy")), "metric")]:
        with pytest.raises(ValueError, match=msg):
            b.submit(bad)
    with pytest.raises(ValueError, match="slots"):
        Batcher(model, tokenizer, DecodeConfig(), slots=0)
    with pytest.raises(ValueError, match="metric"):
        Batcher(model, tokenizer, DecodeConfig(), policy=FixedTau(0.5, "entropy"))
    assert b.step() is None and b.idle


def test_per_row_tau_tensor_matches_scalar_rule():
    """Thresholds near the strict end are judged on their exact value, as the scalar rule does."""
    from mars_core.acceptance import passes

    conf = torch.tensor([[1.0, 1.0, 0.95, float(torch.tensor(0.95, dtype=torch.float32))]])
    for tau in [1.0, 1 - 1e-12, 0.95, 0.9500000001]:
        row = passes(conf.expand(2, 4), torch.tensor([tau, tau], dtype=torch.float64), "probability")
        assert row[0].tolist() == row[1].tolist() == passes(conf, tau, "probability")[0].tolist(), tau


def test_adaptive_policy_moves_tau_and_requests_still_equal_alone(confident_model, tokenizer):
    from mars_core.tau_policy import AdaptiveTau

    policy = AdaptiveTau(latency_target=0.02, patience=2, tighten_patience=3, tau_min=0.5)
    b = Batcher(confident_model, tokenizer, DecodeConfig(block_size=4), slots=2, policy=policy)
    arrivals = [(4 * i, Request(encode_prompt(tokenizer, p), max_new_tokens=30)) for i, p in enumerate(MORE)]
    ids, steps = serve(b, arrivals)
    assert len({s.tau for s in steps}) > 1  # the policy really moved
    for rid, (_, req) in zip(ids, arrivals):
        s = b.done[rid]
        assert (s.out, s.accepted) == alone(confident_model, tokenizer, req, s.taus), rid


def test_a_model_without_sdpa_is_refused(tokenizer):
    m = make_model("qwen2", len(tokenizer))
    m.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="sdpa"):
        Batcher(m, tokenizer, DecodeConfig())


def test_a_request_stopped_while_queued_never_runs(model, tokenizer):
    """One slot, two requests: the second is stopped while it waits. It must leave without a
    forward (no tokens, no tau), and the first must finish as it would alone."""
    ids = encode_prompt(tokenizer, PROMPTS[0])
    queued = TauControl(0.9)
    b = Batcher(model, tokenizer, DecodeConfig(block_size=4), slots=1)
    first = b.submit(Request(ids, max_new_tokens=6))
    second = b.submit(Request(ids, max_new_tokens=6, control=queued))
    b.step()
    assert len(b.waiting) == 1
    queued.stop()
    steps = list(b.run())
    assert b.done[second].out == [] and b.done[second].taus == [] and b.done[second].finished
    assert all(second not in s.admitted for s in steps)
    assert b.done[first].out == alone(model, tokenizer, Request(ids, 6), [0.95] * 6)[0]
