"""Input checks of every endpoint, with messages that name the field.

What a decode setting may be is `mars_core.config`'s rule (`DecodeConfig` raises a ValueError
naming the field); this module only adds what the app limits on top (ranges of the controls,
prompt length) and turns API values (strings, floats from sliders) into the right types.
"""
from __future__ import annotations

import math
from dataclasses import fields

from mars_core import DecodeConfig
from mars_core.config import check_tau
from mars_core.lists import parse_list

SEED_MAX = 2**31 - 1
TEMPERATURE_MAX = 2.0


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def as_int(name: str, value, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi], or a ValueError naming `name` and the range."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number between {lo} and {hi}, got {_shown(value)}") from None
    if not math.isfinite(f) or not f.is_integer():
        raise ValueError(f"{name} must be a whole number between {lo} and {hi}, got {_shown(value)}")
    if not lo <= f <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {int(f)}")
    return int(f)


def as_float(name: str, value, lo: float, hi: float) -> float:
    """`value` as a float in [lo, hi] (nan and inf refused), or a ValueError naming `name`."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number between {lo:g} and {hi:g}, got {_shown(value)}") from None
    if not lo <= f <= hi:  # also refuses nan
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}, got {_shown(value)}")
    return f


def as_number(name: str, value) -> float:
    """A finite float; its range is checked by whoever owns the rule."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {_shown(value)}") from None
    if not math.isfinite(f):
        raise ValueError(f"{name} must be a finite number, got {_shown(value)}")
    return f


def as_choice(name: str, value, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {_shown(value)}")
    return value


def check_prompt(prompt, max_chars: int) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"The prompt must be text, got {type(prompt).__name__} {_shown(prompt)}.")
    if not prompt.strip():
        raise ValueError("The prompt is empty: type a question or pick an example.")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no tokenizer can encode it
        raise ValueError("The prompt contains characters that are not valid Unicode text (a lone surrogate); "
                         "retype or paste it again.") from None
    if len(prompt) > max_chars:
        raise ValueError(f"The prompt has {len(prompt):,} characters; the limit is {max_chars:,}.")
    return prompt


def decode_config(**settings) -> DecodeConfig:
    """A DecodeConfig from already-typed settings; its own ValueError names the field."""
    known = {f.name for f in fields(DecodeConfig)}
    return DecodeConfig(**{k: v for k, v in settings.items() if k in known})


def decode_settings(*, tau, block_size, metric, temperature, seed, max_new_tokens, cache,
                    max_block_size: int, max_new_tokens_cap: int) -> dict:
    """Validated settings shared by both sides of a duel, or a ValueError naming the field."""
    settings = dict(
        tau=as_number("tau", tau),
        block_size=as_int("block size", block_size, 1, max_block_size),
        metric=metric, cache=cache,
        temperature=as_float("temperature", temperature, 0.0, TEMPERATURE_MAX),
        seed=as_int("seed", seed, 0, SEED_MAX),
        max_new_tokens=as_int("max new tokens", max_new_tokens, 1, max_new_tokens_cap),
    )
    decode_config(mode="mars", **settings)  # metric, cache, tau for the metric: the library's rule
    return settings


def parse_taus(text, metric: str = "probability", max_count: int = 12) -> list[float]:
    """A comma-separated list of tau values (each checked for `metric`), or a ValueError."""
    parts = parse_list(text, str, allow_empty=True, name="taus")
    if not parts:
        raise ValueError("taus: give at least one value, e.g. 1.0, 0.9, 0.7")
    if len(parts) > max_count:
        raise ValueError(f"taus: at most {max_count} values per sweep, got {len(parts)}")
    out = []
    for p in parts:
        try:
            out.append(check_tau(as_number("tau", p), metric))
        except ValueError as e:
            raise ValueError(f"taus: {e}") from None
    return out
