"""Bad input gets a ValueError that says what was wrong."""
import pytest

from conftest import PROMPTS
from mars_core import DecodeConfig, TauControl, generate, stream


@pytest.mark.parametrize("kwargs,match", [
    (dict(tau=1.5), r"\[0, 1\]"),
    (dict(tau=-0.1), r"\[0, 1\]"),
    (dict(metric="margin", tau=2.0), r"\[0, 1\]"),
    (dict(metric="entropy", tau=-1.0), ">= 0"),
    (dict(tau=float("nan")), "finite"),
    (dict(block_size=0), "block_size must be >= 1"),
    (dict(metric="logprob"), "unknown metric"),
    (dict(cache="paged"), "unknown cache mode"),
    (dict(mode="jacobi"), "unknown mode"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(temperature=-1.0), "temperature"),
    (dict(cache="block", block_size=8, cache_block_size=4), "cache_block_size"),
    (dict(max_accept=0), "max_accept"),
    (dict(repeat_guard="yes"), "repeat_guard must be True or False"),
    (dict(block_size=2.5), "integer"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DecodeConfig(**kwargs)


def test_entropy_allows_tau_above_one():
    assert DecodeConfig(metric="entropy", tau=3.0).tau == 3.0


def test_bad_prompts(model, tokenizer):
    cfg = DecodeConfig(max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        generate(model, tokenizer, [], cfg)
    with pytest.raises(ValueError, match="empty"):
        generate(model, tokenizer, ["  "], cfg)
    with pytest.raises(ValueError, match="list of strings"):
        generate(model, tokenizer, "a prompt", cfg)
    with pytest.raises(ValueError, match="not a string"):
        generate(model, tokenizer, [3], cfg)


def test_prompt_longer_than_context(model, tokenizer):
    with pytest.raises(ValueError, match="positions"):
        generate(model, tokenizer, ["word " * 600], DecodeConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="positions"):
        generate(model, tokenizer, PROMPTS[:1], DecodeConfig(max_new_tokens=600))


def test_tau_control_validates():
    c = TauControl(0.5)
    with pytest.raises(ValueError):
        c.tau = 1.2
    assert c.tau == 0.5
    with pytest.raises(ValueError):
        TauControl(0.5, metric="bogus")


def test_control_metric_must_match(model, tokenizer):
    with pytest.raises(ValueError, match="metric"):
        list(stream(model, tokenizer, PROMPTS[0], DecodeConfig(metric="entropy", tau=1.0), TauControl(0.5)))
