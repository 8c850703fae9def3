"""Every decoder against the no-cache reference and against `model.generate`, token for token."""
import dataclasses

import pytest
import torch

from conftest import PROMPTS
from mars_core import DecodeConfig, TauControl, generate, stream
from mars_core.acceptance import accept, choose_tokens, confidence, passes
from mars_core.prompts import encode_prompt

CACHES = ["none", "sliding", "block"]


def hf_greedy(model, tokenizer, prompt, n):
    ids = torch.tensor([encode_prompt(tokenizer, prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=n, pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    eos = tokenizer.eos_token_id
    return out[: out.index(eos)] if eos in out else out


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("mode", ["ar", "mars"])
def test_tau_one_is_exactly_greedy_ar(model, tokenizer, mode, cache):
    cfg = DecodeConfig(mode=mode, tau=1.0, block_size=4, cache=cache, cache_block_size=8, max_new_tokens=24)
    res = generate(model, tokenizer, PROMPTS, cfg)
    for prompt, got in zip(PROMPTS, res.token_ids):
        assert got == hf_greedy(model, tokenizer, prompt, 24)
    assert res.stats.tokens_per_forward == 1.0 or mode == "ar"
    assert all(max(step) <= 1 for step in res.stats.accepted_per_step)


@pytest.mark.parametrize("mode", ["ar", "mars"])
def test_single_prompt_sliding_path_is_greedy_ar(model, tokenizer, mode):
    """Batch 1 takes the sliding decoder's own path (prompt in the first forward, HF's mask)."""
    cfg = DecodeConfig(mode=mode, tau=1.0, block_size=4, cache="sliding", max_new_tokens=24)
    for prompt in PROMPTS:
        res = generate(model, tokenizer, [prompt], cfg)
        assert res.token_ids[0] == hf_greedy(model, tokenizer, prompt, 24)
        assert res.stats.prefill_forwards == 0  # the prompt went in with the first decode forward


SETTINGS = [
    ("probability", 0.0), ("probability", 0.9), ("probability", 0.5),
    ("entropy", 0.5), ("entropy", 2.0), ("margin", 0.8), ("margin", 0.3),
]


@pytest.mark.parametrize("metric,tau", SETTINGS)
def test_cache_modes_equal_reference_and_rows_alone(confident_model, tokenizer, metric, tau):
    base = dict(tau=tau, metric=metric, block_size=4, max_new_tokens=40)
    ref = generate(confident_model, tokenizer, PROMPTS, DecodeConfig(cache="none", **base))
    multi = sum(c > 1 for step in ref.stats.accepted_per_step for c in step)
    assert multi > 0, "the setting must exercise multi-token steps"
    for cache, cbs in [("sliding", 16), ("block", 4), ("block", 8), ("block", 32)]:
        res = generate(confident_model, tokenizer, PROMPTS, DecodeConfig(cache=cache, cache_block_size=cbs, **base))
        assert res.token_ids == ref.token_ids, (cache, cbs)
        assert res.stats.tokens == ref.stats.tokens
        assert res.stats.row_forwards == ref.stats.row_forwards  # same acceptance decisions
    for i, prompt in enumerate(PROMPTS):
        for cache in CACHES:
            alone = generate(confident_model, tokenizer, [prompt], DecodeConfig(cache=cache, cache_block_size=8, **base))
            assert alone.token_ids[0] == ref.token_ids[i], (cache, i)


def test_tau_zero_accepts_the_whole_block(model, tokenizer):
    res = generate(model, tokenizer, PROMPTS[:1], DecodeConfig(tau=0.0, block_size=4, max_new_tokens=16))
    assert res.stats.per_sequence(0) == [4, 4, 4, 4]
    assert res.stats.forwards == 4 and res.stats.tokens_per_forward == 4.0


def test_sampling_is_seeded_and_batch_equals_alone(confident_model, tokenizer):
    def run(prompts, cache, seed=3):
        cfg = DecodeConfig(tau=0.7, temperature=1.0, seed=seed, cache=cache, max_new_tokens=30)
        return generate(confident_model, tokenizer, prompts, cfg).token_ids

    batch = run(PROMPTS[:3], "none")
    assert batch == run(PROMPTS[:3], "none")
    for cache in CACHES:
        assert run(PROMPTS[:3], cache) == batch
    # row i of a batch uses seed + i
    assert run([PROMPTS[2]], "sliding", seed=5) == [batch[2]]
    assert run(PROMPTS[:1], "none", seed=4) != batch[:1]


@pytest.mark.parametrize("cache", CACHES + ["cursor"])
def test_tau_can_change_between_steps(confident_model, tokenizer, cache):
    cfg = DecodeConfig(tau=1.0, block_size=4, cache=cache, cache_block_size=8, max_new_tokens=40)
    control = TauControl(1.0)
    counts = []
    for ev in stream(confident_model, tokenizer, PROMPTS[1], cfg, control):
        counts.append(len(ev.tokens[0]))
        if ev.step == 4:
            control.tau = 0.0
        assert ev.tau == (1.0 if ev.step <= 4 else 0.0)
    assert counts[:5] == [1] * 5 and max(counts[5:]) == 4


def test_stream_events_add_up(confident_model, tokenizer):
    cfg = DecodeConfig(tau=0.5, max_new_tokens=30)
    events = list(stream(confident_model, tokenizer, PROMPTS[0], cfg))
    tokens = [t for ev in events for t in ev.tokens[0]]
    assert tokens == generate(confident_model, tokenizer, [PROMPTS[0]], cfg).token_ids[0]
    assert [ev.step for ev in events] == list(range(len(events)))
    assert events[-1].finished == [True] and events[-1].forwards == len(events)
    assert all(len(ev.tokens[0]) == len(ev.confidences[0]) for ev in events)
    assert all(b.elapsed >= a.elapsed for a, b in zip(events, events[1:]))


def test_stop_ends_a_generation_early(confident_model, tokenizer):
    control = TauControl(1.0)
    events = []
    for ev in stream(confident_model, tokenizer, PROMPTS[0], DecodeConfig(max_new_tokens=50), control):
        events.append(ev)
        control.stop()
    assert len(events) == 1


def cut_at(tokens, stops):
    """`tokens` up to, not including, the first of `stops`: what a decoder must return once
    `stops` are EOS, given its output without them (the steps before the stop are unchanged)."""
    return next((tokens[:i] for i, t in enumerate(tokens) if t in stops), tokens)


def step_starts(stats, i):
    """Offsets in row `i`'s output at which a forward's block began."""
    starts, at = set(), 0
    for n in stats.per_sequence(i):
        starts.add(at)
        at += n
    return starts


def check_extra_stops(model, tokenizer, prompts, cfg, stops, caches):
    """With `stops` added to the EOS ids, every cache returns the reference output cut at the
    first stop. Returns the reference and the cuts, for the caller's guards."""
    ref = generate(model, tokenizer, prompts, dataclasses.replace(cfg, cache="none"))
    want = [cut_at(t, stops) for t in ref.token_ids]
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
    try:
        for cache in caches:
            got = generate(model, tokenizer, prompts, dataclasses.replace(cfg, cache=cache)).token_ids
            assert got == want, cache
    finally:
        model.generation_config.eos_token_id = eos
    return ref, want


def test_per_sample_eos_and_max_new_tokens(model, tokenizer):
    eos = tokenizer.eos_token_id
    cfg = DecodeConfig(tau=1.0, max_new_tokens=12)
    ar = generate(model, tokenizer, PROMPTS, DecodeConfig(mode="ar", max_new_tokens=12))
    assert all(len(t) <= 12 and eos not in t for t in ar.token_ids)
    # make the 3rd generated token of every row an EOS: every row stops at length 2 or earlier
    stops = {t[2] for t in ar.token_ids if len(t) > 2}
    ref, want = check_extra_stops(model, tokenizer, PROMPTS, cfg, stops, CACHES)
    assert ref.token_ids == ar.token_ids  # tau = 1: the reference is AR
    assert all(len(w) <= 2 for w in want) and 2 in map(len, want)
    assert len(set(map(len, want))) >= 2  # guard: rows stop at different points


def test_eos_accepted_mid_block(confident_model, tokenizer):
    check_eos_mid_block(confident_model, tokenizer, PROMPTS, CACHES)


def check_eos_mid_block(confident_model, tokenizer, prompts, caches):
    """A stop accepted after other tokens of its block: those tokens are kept, the rest dropped."""
    cfg = DecodeConfig(tau=0.5, block_size=4, cache_block_size=8, max_new_tokens=24)
    ref = generate(confident_model, tokenizer, prompts, dataclasses.replace(cfg, cache="none"))
    # per row, the 2nd token of its first block of >= 3: an EOS there ends the row mid-block
    stops = set()
    for i, toks in enumerate(ref.token_ids):
        starts = sorted(step_starts(ref.stats, i))
        wide = [s for s, e in zip(starts, starts[1:] + [len(toks)]) if e - s >= 3]
        stops.update(toks[s + 1] for s in wide[:1])
    ref, want = check_extra_stops(confident_model, tokenizer, prompts, cfg, stops, caches)
    mid = [len(w) for i, w in enumerate(want) if len(w) < len(ref.token_ids[i])
           and len(w) not in step_starts(ref.stats, i)]
    assert len(mid) >= 2  # guard: rows really stop inside a block, after tokens of it


def loop_accept(logits, tau, metric, max_accept=None):
    """Position by position, the way the spec words it."""
    tokens, probs = choose_tokens(logits, 0.0)
    conf = confidence(probs, tokens, metric)
    out = []
    for row in range(logits.shape[0]):
        n = 1
        while n < logits.shape[1] and bool(passes(conf[row, n : n + 1], tau, metric)[0]):
            n += 1
        out.append(min(n, max_accept) if max_accept else n)
    return tokens, torch.tensor(out)


@pytest.mark.parametrize("metric,tau", SETTINGS + [("probability", 1.0), ("entropy", 0.0), ("margin", 1.0)])
@pytest.mark.parametrize("max_accept", [None, 2])
def test_vectorised_acceptance_equals_a_loop(metric, tau, max_accept):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 6, 50, generator=g) * torch.rand(64, 6, 1, generator=g) * 12
    tokens, _, n = accept(logits, tau, metric, max_accept=max_accept)
    ref_tokens, ref_n = loop_accept(logits, tau, metric, max_accept)
    assert torch.equal(tokens, ref_tokens) and torch.equal(n, ref_n)
    assert (n >= 1).all()
    if tau in (1.0,) or (metric == "entropy" and tau == 0.0):
        assert (n == 1).all()


def test_saturated_softmax_still_one_token_at_tau_one():
    logits = torch.zeros(2, 4, 10)
    logits[..., 3] = 1000.0  # p == 1.0 exactly in fp32
    _, conf, n = accept(logits, 1.0)
    assert (conf == 1.0).all() and (n == 1).all()
