"""Scoring a reply of the synthetic task: the first ``#### <answer>`` line against the answer."""

from __future__ import annotations

import re
from fractions import Fraction

_ANSWER_LINE = re.compile(r"^[ \t]*####[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)
_NUMBER = re.compile(r"^-?(\d+|\d{1,3}(,\d{3})+)(\.\d+)?$")
_LIST = re.compile(r"^\[(.*)\]$")


def extract_answer(text: str) -> str | None:
    """The answer from the first ``#### <answer>`` line, whitespace-normalised.

    The first answer line counts, so a reply cannot hedge with several.
    Returns None when ``text`` has no non-empty answer line.
    """
    if not isinstance(text, str):
        return None
    match = _ANSWER_LINE.search(text)
    return " ".join(match.group(1).split()) if match else None


def _as_number(text: str) -> Fraction | None:
    """``text`` as an exact number (``68``, ``68.0``, ``1,000``), else None."""
    return Fraction(text.replace(",", "")) if _NUMBER.match(text) else None


def _canonical(text: str) -> tuple:
    """A comparable form: a number, a list of numbers, or plain text."""
    text = " ".join(text.split())
    number = _as_number(text)
    if number is not None:
        return ("number", number)
    match = _LIST.match(text)
    if match:
        items = [item.strip() for item in match.group(1).split(",")] if match.group(1).strip() else []
        numbers = [_as_number(item) for item in items]
        if all(x is not None for x in numbers):
            return ("list", tuple(numbers))
    return ("text", text)


def score(text: str, answer: str) -> bool:
    """True when the reply's answer line matches ``answer`` exactly.

    Numbers compare as numbers (``68`` equals ``68.0``), lists of numbers
    element by element (spacing inside the brackets does not matter), other
    text after whitespace normalisation. No answer line scores False.
    """
    got = extract_answer(text)
    return got is not None and _canonical(got) == _canonical(str(answer))
