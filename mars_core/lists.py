"""Comma-separated lists ("0.95,0.8", "1,4,8") from a command line or a text box.

One parser for the CLIs (argparse `type=`) and the app: `ListError` is a `ValueError` (what the
app catches) and an `argparse.ArgumentTypeError` (so argparse prints its message as is).
"""
from __future__ import annotations

import argparse
from typing import Callable, TypeVar

T = TypeVar("T")
_KINDS = {int: "integers", float: "numbers", str: "names"}


class ListError(ValueError, argparse.ArgumentTypeError):
    pass


def parse_list(text: str, kind: Callable[[str], T] = float, *, minimum: float | None = None,
               allow_empty: bool = False, name: str | None = None) -> tuple[T, ...]:
    """The comma-separated items of `text` converted by `kind` (int, float or str); empty items
    are skipped. Raises `ListError` naming `name` when an item does not convert, is below
    `minimum`, or (unless `allow_empty`) when there is no item."""
    what = _KINDS.get(kind, "values")
    label = f"{name}: " if name else ""
    try:
        vals = tuple(kind(x.strip()) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ListError(f"{label}expected comma-separated {what}, got {text!r}") from None
    if not vals and not allow_empty:
        raise ListError(f"{label}expected at least one of comma-separated {what}, got {text!r}")
    if minimum is not None and any(v < minimum for v in vals):
        raise ListError(f"{label}expected comma-separated {what} >= {minimum:g}, got {text!r}")
    return vals


def list_arg(kind: Callable[[str], T] = float, *, minimum: float | None = None) -> Callable[[str], tuple[T, ...]]:
    """`parse_list` as an argparse `type=`: `p.add_argument("--taus", type=list_arg(float))`."""
    def parse(text: str) -> tuple[T, ...]:
        return parse_list(text, kind, minimum=minimum)

    parse.__name__ = f"comma-separated {_KINDS.get(kind, 'values')}"
    return parse
