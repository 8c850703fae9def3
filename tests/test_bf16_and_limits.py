"""bf16 decoding, and the cursor cache's capacity.

bf16: what is asserted and why. Different decoders (and MARS vs AR) run different shapes, so
their bf16 logits may differ in the last bits; exact token equality across decoders is only a
fair demand where the greedy choice is far from a tie. So:
  * the acceptance counts, which do not depend on logits at the extreme thresholds, are exact:
    tau = 1 accepts one token per step, tau = 0 the whole block (until EOS / max_new_tokens);
  * every decoder runs on a bf16 model and returns sane outputs and statistics;
  * every decoder, MARS and AR, on a bf16 model whose logits a hook replaces by the position
    script of test_scripted.py (confidences 0.3 / 0.95, one clear token): the real bf16 forwards
    run, and the output must equal the script's expectation exactly. A random tiny model in bf16
    is no good for this: its greedy path comes within 0.01-0.3 logits of a tie (measured), about
    bf16's rounding there, so bf16 and fp32 (or two decoders' shapes) may legitimately differ.
"""
from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, generate
from mars_core.decode_cursor import CursorCache
from mars_core.prompts import encode_prompt
from scripted import scripted_model
from test_scripted import MAX_NEW, TAU, expected

CACHES = [("none", 16), ("sliding", 16), ("block", 8), ("cursor", 16)]


@pytest.fixture(scope="module")
def bf16_pair(tokenizer):
    fp32 = make_model("qwen2", len(tokenizer), seed=1, head_scale=30.0)
    fp32.generation_config.eos_token_id = tokenizer.eos_token_id  # for the cursor capacity test
    bf16 = make_model("qwen2", len(tokenizer), seed=1, head_scale=30.0).to(torch.bfloat16)
    bf16.generation_config.eos_token_id = tokenizer.eos_token_id
    return fp32, bf16


@pytest.mark.parametrize("cache,cbs", CACHES)
def test_bf16_extreme_taus_give_exact_acceptance(tokenizer, bf16_pair, cache, cbs):
    _, bf16 = bf16_pair
    for tau, per_step in ((1.0, 1), (0.0, 4)):
        res = generate(bf16, tokenizer, PROMPTS, DecodeConfig(tau=tau, block_size=4, cache=cache,
                                                              cache_block_size=cbs, max_new_tokens=13))
        for i, out in enumerate(res.token_ids):
            assert tokenizer.eos_token_id not in out and len(out) <= 13
            steps = res.stats.per_sequence(i)
            assert all(c == per_step for c in steps[:-1]), (tau, i, steps)  # the last may stop at EOS / the cap
            assert 1 <= steps[-1] <= per_step and len(out) <= sum(steps)
        assert res.stats.tokens == sum(len(t) for t in res.token_ids) > 0


@pytest.mark.parametrize("mode", ["mars", "ar"])
def test_bf16_decoders_match_the_scripted_expectation(tokenizer, mode):
    """The real bf16 model runs every forward (caches, masks and buffers in bf16); the scripted
    logits keep the choices far from ties, so the expectation is exact (see test_scripted)."""
    model, script = scripted_model(tokenizer)
    model.to(torch.bfloat16)
    block = 4 if mode == "mars" else 1
    want = [expected(script, len(encode_prompt(tokenizer, p)), block) for p in PROMPTS]
    for cache, cbs in CACHES:
        cfg = DecodeConfig(mode=mode, tau=TAU, block_size=4, cache=cache, cache_block_size=cbs,
                           max_new_tokens=MAX_NEW)
        res = generate(model, tokenizer, PROMPTS, cfg)
        assert res.token_ids == [t for t, _ in want], cache
        assert [res.stats.per_sequence(i) for i in range(len(PROMPTS))] == [s for _, s in want], cache
        alone = generate(model, tokenizer, [PROMPTS[0]], cfg)  # the single-row paths
        assert alone.token_ids[0] == want[0][0], cache


def test_cursor_cache_overflow_is_a_clear_error():
    cache = CursorCache(batch=2, capacity=8)
    cache.plan([0, 3], torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]]), 8)  # fills slot 7 exactly
    with pytest.raises(RuntimeError, match=r"cursor cache overflow: 9 > 8 slots"):
        cache.plan([0, 4], torch.tensor([[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]]), 9)


def test_cursor_cache_holds_the_longest_decode(tokenizer, bf16_pair):
    """tau = 0 accepts whole blocks: the cursors run as far as a decode can take them."""
    fp32, _ = bf16_pair
    prompts = [PROMPTS[1], PROMPTS[2]]  # the longest and the shortest prompt
    for B, n in ((4, 13), (3, 12), (5, 1)):
        res = generate(fp32, tokenizer, prompts, DecodeConfig(tau=0.0, block_size=B, cache="cursor", max_new_tokens=n))
        ref = generate(fp32, tokenizer, prompts, DecodeConfig(tau=0.0, block_size=B, cache="none", max_new_tokens=n))
        assert res.token_ids == ref.token_ids
