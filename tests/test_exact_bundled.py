"""Lossless MARS and spec on the bundled models: exact, and several tokens per forward.

The random models of the other tests cannot show that the drafts are good (their mask
predictions are noise); the bundled MARS model's are, so a wrong group (drafts read from the
masks of another accept count) shows here as a collapse of tokens per forward.
"""
import os

import pytest

from mars_core import DecodeConfig, generate, load_model
from test_bundled_models import CASES, ROOT

PROMPTS = [q for q, _ in CASES]


@pytest.fixture(scope="module")
def models():
    return {name: load_model(os.path.join(ROOT, name), device="cpu") for name in ("tiny-ar-sft", "tiny-mars-b4")}


def test_lossless_is_ar_with_several_tokens_per_forward(models):
    model, tok = models["tiny-mars-b4"]
    ar = generate(model, tok, PROMPTS, DecodeConfig(mode="ar", cache="cursor", max_new_tokens=256))
    res = generate(model, tok, PROMPTS, DecodeConfig(mode="lossless", block_size=4, cache="cursor", max_new_tokens=256))
    assert res.token_ids == ar.token_ids
    assert res.stats.tokens_per_forward > 2.5  # 3.5 when this was written
    assert res.stats.draft_acceptance > 0.8
    for groups in ("all", "ends"):  # other layouts: the same output, drafts after rejections too
        other = generate(model, tok, PROMPTS, DecodeConfig(mode="lossless", cache="cursor", max_new_tokens=256,
                                                           draft_groups=groups))
        assert other.token_ids == ar.token_ids
        assert other.stats.tokens_per_forward >= res.stats.tokens_per_forward


def test_spec_mars_beats_spec_in_tokens_per_target_forward(models):
    target, tok = models["tiny-mars-b4"]
    draft, _ = models["tiny-ar-sft"]
    ar = generate(target, tok, PROMPTS, DecodeConfig(mode="ar", cache="cursor", max_new_tokens=256))
    base = dict(mode="spec", draft_tokens=4, cache="cursor", max_new_tokens=256)
    spec = generate(target, tok, PROMPTS, DecodeConfig(block_size=1, **base), draft_model=draft)
    assert spec.token_ids == ar.token_ids and spec.stats.tokens_per_forward > 2.5
    both = generate(target, tok, PROMPTS, DecodeConfig(block_size=4, tau=0.95, **base), draft_model=draft)
    assert both.stats.tokens_per_forward > 1.15 * spec.stats.tokens_per_forward
    assert both.stats.draft_forwards < spec.stats.draft_forwards


def test_lossless_sampling_drafts_from_its_masks(models):
    """Sampled lossless MARS (`decode_exact`'s self-drafter) drafts the tokens its last group sampled,
    in order: on the trained masks most are accepted (3.2-3.3 tokens per forward at temperature 0.3
    and 1 when written); drafts read one column off (a shifted group) collapse that to about 1.2."""
    model, tok = models["tiny-mars-b4"]
    for temperature in (0.3, 1.0):
        res = generate(model, tok, PROMPTS, DecodeConfig(mode="lossless", block_size=4, cache="cursor",
                                                         max_new_tokens=256, temperature=temperature, seed=0))
        assert res.stats.tokens_per_forward > 2.5, (temperature, res.stats.tokens_per_forward)
        assert res.stats.draft_acceptance > 0.8, (temperature, res.stats.draft_acceptance)
