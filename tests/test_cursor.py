"""The cursor-based KV cache against the no-cache reference, rows alone and `model.generate`."""
import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, generate
from mars_core.decode_cursor import CursorCache
from test_decoders import SETTINGS, check_extra_stops, hf_greedy, check_eos_mid_block

# a batch of >= 6 prompts of very different lengths
BATCH = PROMPTS + ["7 + 8 = ?", "List three numbers between 10 and 20, then sort them from largest to smallest."]


@pytest.mark.parametrize("mode", ["ar", "mars"])
def test_tau_one_is_exactly_greedy_ar(model, tokenizer, mode):
    cfg = DecodeConfig(mode=mode, tau=1.0, block_size=4, cache="cursor", max_new_tokens=24)
    res = generate(model, tokenizer, BATCH, cfg)
    for prompt, got in zip(BATCH, res.token_ids):
        assert got == hf_greedy(model, tokenizer, prompt, 24)
    assert all(max(step) <= 1 for step in res.stats.accepted_per_step)
    assert res.stats.prefill_forwards == 0  # the prompt goes in with the first decode forward


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def confident(request, tokenizer):
    m = make_model(request.param, len(tokenizer), seed=1, head_scale=60.0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m


@pytest.mark.parametrize("metric,tau", SETTINGS)
def test_cursor_equals_reference_and_rows_alone(confident, tokenizer, metric, tau):
    base = dict(tau=tau, metric=metric, block_size=4, max_new_tokens=40)
    ref = generate(confident, tokenizer, BATCH, DecodeConfig(cache="none", **base))
    per_row = [c for step in ref.stats.accepted_per_step for c in step]
    assert any(c > 1 for c in per_row), "the setting must exercise multi-token steps"
    res = generate(confident, tokenizer, BATCH, DecodeConfig(cache="cursor", **base))
    assert res.token_ids == ref.token_ids
    assert res.stats.tokens == ref.stats.tokens
    assert res.stats.row_forwards == ref.stats.row_forwards  # same acceptance decisions
    # every row accepts on its own schedule: the batch takes as many forwards as its slowest row
    assert res.stats.forwards == max(len(ref.stats.per_sequence(i)) for i in range(len(BATCH)))
    for i, prompt in enumerate(BATCH):
        alone = generate(confident, tokenizer, [prompt], DecodeConfig(cache="cursor", **base))
        assert alone.token_ids[0] == ref.token_ids[i], i
        assert alone.stats.per_sequence(0) == res.stats.per_sequence(i), i


def test_rows_finishing_at_different_steps(confident, tokenizer):
    """Rows stop (EOS) at different steps in the middle of multi-token steps and drop out."""
    eos = tokenizer.eos_token_id
    base = dict(tau=0.5, block_size=4, max_new_tokens=40)
    full = generate(confident, tokenizer, BATCH, DecodeConfig(cache="none", **base)).token_ids
    stop = full[1][5]  # a token some rows produce mid-stream
    confident.generation_config.eos_token_id = [eos, stop]
    try:
        ref = generate(confident, tokenizer, BATCH, DecodeConfig(cache="none", **base))
        assert len({len(t) for t in ref.token_ids}) > 2  # rows really stop at different points
        res = generate(confident, tokenizer, BATCH, DecodeConfig(cache="cursor", **base))
        assert res.token_ids == ref.token_ids and res.stats.row_forwards == ref.stats.row_forwards
    finally:
        confident.generation_config.eos_token_id = eos


@pytest.mark.parametrize("B", [1, 2, 8])
def test_other_block_sizes(confident, tokenizer, B):
    base = dict(tau=0.5, block_size=B, max_new_tokens=30)
    ref = generate(confident, tokenizer, BATCH, DecodeConfig(cache="none", **base))
    assert generate(confident, tokenizer, BATCH, DecodeConfig(cache="cursor", **base)).token_ids == ref.token_ids


def test_sampling_is_seeded_and_batch_equals_alone(confident_model, tokenizer):
    def run(prompts, cache, seed=3):
        cfg = DecodeConfig(tau=0.7, temperature=1.0, seed=seed, cache=cache, max_new_tokens=30)
        return generate(confident_model, tokenizer, prompts, cfg).token_ids

    batch = run(BATCH, "none")
    assert run(BATCH, "cursor") == batch
    assert run([BATCH[4]], "cursor", seed=7) == [batch[4]]  # row i uses seed + i


def test_per_sample_eos_and_max_new_tokens(model, tokenizer):
    ar = generate(model, tokenizer, BATCH, DecodeConfig(mode="ar", cache="none", max_new_tokens=12))
    stops = {t[2] for t in ar.token_ids if len(t) > 2}  # every row stops at length 2 or earlier
    cfg = DecodeConfig(tau=1.0, max_new_tokens=12)
    ref, want = check_extra_stops(model, tokenizer, BATCH, cfg, stops, ["cursor"])
    assert ref.token_ids == ar.token_ids  # tau = 1: the reference is AR
    assert all(len(w) <= 2 for w in want) and 2 in map(len, want)
    assert len(set(map(len, want))) >= 2  # guard: rows stop at different points


def test_eos_accepted_mid_block(confident_model, tokenizer):
    check_eos_mid_block(confident_model, tokenizer, BATCH, ["cursor"])


def test_cache_never_grows_and_mask_slots_are_overwritten(confident_model, tokenizer):
    """The buffers are allocated once; a row's cursor only counts real tokens."""
    seen = []
    orig = CursorCache.plan

    def spy(self, start, slots, length):
        seen.append((list(start), slots.shape[1], self.capacity, [k.data_ptr() for k in self.keys]))
        return orig(self, start, slots, length)

    CursorCache.plan = spy
    try:
        cfg = DecodeConfig(tau=0.5, block_size=4, cache="cursor", max_new_tokens=40)
        res = generate(confident_model, tokenizer, [PROMPTS[1]], cfg)
    finally:
        CursorCache.plan = orig
    prompt_len = seen[1][0][0]  # the whole prompt went in with the first forward
    accepted = res.stats.per_sequence(0)
    assert prompt_len > 0 and max(accepted) > 1
    for step, (start, _, cap, ptrs) in enumerate(seen[1:], start=1):
        # cursor = prompt + every accepted token but the last step's (fed in this forward)
        assert start[0] == prompt_len + sum(accepted[: step - 1])
        assert cap == seen[0][2] and ptrs == seen[1][3]


def test_unknown_cache_is_still_rejected():
    with pytest.raises(ValueError, match="cursor"):
        DecodeConfig(cache="ring")
