"""Seeded synthetic chat tasks in the style of GSM8K, in miniature.

Every example is a two-turn chat: the user asks a short question, the
assistant answers with one templated step per line and then the fixed
answer line::

    #### <answer>

(four ``#`` characters, one space, the answer; it is always the last line).
The solution wording is deliberately predictable: a model with a few million
parameters has to be able to learn it.

Families and their fixed share of every call to :func:`make_examples`:

* ``arithmetic`` (60%): word problems with 1-3 operations out of add,
  subtract, multiply and divide. Start values are 10..300, added or
  subtracted amounts 10..99, multipliers and divisors 12..30 (quotients below 100); every operand
  and intermediate value lies in 10..9999 and divisions are exact. Each
  step line reads ``Tom had 45 and got 23 more, so 45 + 23 = 68.`` (the
  object is not repeated, to keep 3-step examples under 200 tokens).
* ``units`` (20%): one unit conversion (e.g. 3 kilometers to meters or
  240 minutes to hours) with an exact integer result.
* ``lists`` (20%): sort ascending/descending, reverse, max, min or sum of a
  short list of two-digit numbers. Lists are written ``[12, 45, 67]``.

Train and eval never share an example: each problem has a canonical key (its
family, operations and numbers, independent of names and wording), and a
stable SHA-256 hash of that key puts it in exactly one split. Because the
key is coarser than the question text, eval questions are not only absent
from train, even their underlying calculations are.

CLI: ``python -m tasks.synthetic --n 1000 --seed 0 --split train
--output FILE.jsonl`` writes JSONL; ``--show K`` prints K examples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

ANSWER_PREFIX = "####"
SPLITS = ("train", "eval")
# Fixed family proportions; counts per call are rounded by largest remainder.
FAMILY_WEIGHTS = (("arithmetic", 0.6), ("units", 0.2), ("lists", 0.2))
# One hash bucket out of EVAL_BUCKETS belongs to eval, the rest to train.
EVAL_BUCKETS = 10
# Draws allowed per example before giving up (the problem space is exhausted).
MAX_ATTEMPTS = 10_000

MIN_VALUE, MAX_VALUE = 10, 9999
ADD_RANGE = (10, 99)
START_RANGE = (10, 300)
FACTOR_RANGE = (12, 30)
NUMBER_ATTEMPTS = 50  # number redraws per operation sequence

NAMES = (
    "Tom", "Anna", "Ben", "Maya", "Leo", "Sara", "Omar", "Lily", "Jack", "Nina",
    "Ravi", "Emma", "Sam", "Zoe", "Ivan", "Mia", "Noah", "Ella", "Kai", "Lucy",
    "Finn", "Aisha", "Hugo", "Chloe", "Max", "Rosa", "Eli", "Yuki", "Dan", "Ines",
)
OBJECTS = (
    "apples", "marbles", "stickers", "pencils", "cookies", "stamps", "coins",
    "books", "shells", "cards", "beads", "oranges", "buttons", "candles",
    "toy cars", "balloons", "eggs", "crayons", "tickets", "leaves",
)


@dataclass(frozen=True)
class Problem:
    """One generated problem before it is turned into a chat example."""

    family: str
    key: str  # canonical content (operations and numbers); decides the split
    question: str
    steps: tuple[str, ...]
    answer: str

    def solution(self) -> str:
        """The assistant turn: one step per line, then the answer line."""
        return "\n".join((*self.steps, f"{ANSWER_PREFIX} {self.answer}"))

    def to_example(self) -> dict:
        """The chat-format dict that :func:`make_examples` returns."""
        return {
            "messages": [
                {"role": "user", "content": self.question},
                {"role": "assistant", "content": self.solution()},
            ],
            "answer": self.answer,
            "family": self.family,
        }


# --------------------------------------------------------------------------
# Arithmetic word problems
# --------------------------------------------------------------------------

START_TEMPLATES = (
    "{name} has {n} {obj}.",
    "{name} starts with {n} {obj}.",
    "{name}'s bag holds {n} {obj}.",
    "{name} owns {n} {obj}.",
    "At first, {name} has {n} {obj}.",
    "{name} keeps {n} {obj} in a box.",
    "{name} has collected {n} {obj}.",
    "{name} begins with {n} {obj}.",
)
OP_TEMPLATES = {
    "add": (
        "Then {name} buys {n} more.",
        "{name} finds {n} more {obj}.",
        "A friend gives {name} {n} more.",
        "Later, {name} gets {n} more.",
        "{name} receives {n} extra {obj}.",
        "Next, {name} picks up {n} more.",
        "{name} wins {n} more {obj}.",
        "{name} is given {n} more.",
    ),
    "sub": (
        "Then {name} gives away {n}.",
        "{name} sells {n} of them.",
        "{name} loses {n} {obj}.",
        "Later, {name} uses up {n}.",
        "{name} donates {n} {obj}.",
        "Next, {name} gives {n} to a friend.",
        "{name} trades away {n}.",
        "{name} eats {n} of them.",
    ),
    "mul": (
        "Then the {obj} grow to {n} times as many.",
        "{name} ends up with {n} times as many.",
        "Next, the count is multiplied by {n}.",
        "{name} fills {n} boxes with that many each.",
        "Each one is swapped for {n} new ones.",
        "{name} gets {n} times as many {obj}.",
        "The pile becomes {n} times bigger.",
        "Then {name} has {n} times that many.",
    ),
    "div": (
        "{name} splits them into {n} equal bags and keeps one.",
        "{name} shares them equally among {n} and keeps one share.",
        "Then {name} packs them into {n} equal boxes and keeps one.",
        "{name} makes {n} equal piles and keeps one pile.",
        "{name} keeps one of {n} equal groups.",
        "{name} spreads them over {n} equal shelves and keeps one.",
        "Next, {name} makes {n} equal rows and keeps one row.",
        "{name} sorts them into {n} equal heaps and keeps one.",
    ),
}
QUESTION_TEMPLATES = (
    "How many {obj} does {name} have now?",
    "How many does {name} end up with?",
    "How many {obj} does {name} have at the end?",
    "How many are left?",
    "How many {obj} remain?",
    "How many does {name} hold now?",
    "What is the final number of {obj}?",
    "How many {obj} are there in the end?",
)
# One fixed solution line per operation, whatever the question's wording. Multiplication and
# division are written out in the small steps a few-million-parameter model can learn (a
# two-digit factor split into tens and units; division as two rounds of "largest multiple,
# remainder"), the way a student shows work, instead of one opaque "287 * 26 = 7462".
STEP_TEMPLATES = {
    "add": "{name} had {x} and got {n} more, so {work}.",
    "sub": "{name} had {x} and lost {n}, so {work}.",
    "mul": "{name} had {x}, then {n} times as many, so {work}.",
    "div": "{name} had {x}, split into {n} equal parts, so {work}.",
}


def _work(op: str, x: int, n: int) -> str:
    """The shown computation of ``x op n``, ending in ``= result``."""
    y = _apply(op, x, n)
    if op in ("add", "sub"):
        return f"{x} {SYMBOLS[op]} {n} = {y}"
    if op == "mul":
        tens, units = n - n % 10, n % 10
        if units == 0:
            return f"{x} * {n} = {y}"
        return f"{x} * {n} = {x} * {tens} + {x} * {units} = {x * tens} + {x * units} = {y}"
    q_tens, q_units = y - y % 10, y % 10  # y < 100 (see _operand)
    rest = x - n * q_tens
    return (f"{x} / {n}: {n} * {q_tens} = {n * q_tens}, {x} - {n * q_tens} = {rest}, "
            f"{n} * {q_units} = {rest}, so {x} / {n} = {y}")


SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _operand(rng: random.Random, op: str, x: int) -> int | None:
    """An operand for applying ``op`` to ``x`` that keeps values in range.

    Returns None when no operand works (e.g. ``x`` has no divisor in
    FACTOR_RANGE); the caller then redraws the numbers.
    """
    if op == "add":
        hi = min(ADD_RANGE[1], MAX_VALUE - x)
        return rng.randint(ADD_RANGE[0], hi) if hi >= ADD_RANGE[0] else None
    if op == "sub":
        hi = min(ADD_RANGE[1], x - MIN_VALUE)
        return rng.randint(ADD_RANGE[0], hi) if hi >= ADD_RANGE[0] else None
    if op == "mul":
        hi = min(FACTOR_RANGE[1], MAX_VALUE // x)
        return rng.randint(FACTOR_RANGE[0], hi) if hi >= FACTOR_RANGE[0] else None
    divisors = [
        k for k in range(FACTOR_RANGE[0], FACTOR_RANGE[1] + 1)
        if x % k == 0 and MIN_VALUE <= x // k < 100  # a two-digit quotient: two rounds of work
    ]
    return rng.choice(divisors) if divisors else None


def _apply(op: str, x: int, n: int) -> int:
    """The exact integer result of ``x op n``."""
    return {"add": x + n, "sub": x - n, "mul": x * n, "div": x // n}[op]


def _arith_numbers(rng: random.Random, ops: list[str]) -> tuple[int, list[int]] | None:
    """A start value and one operand per op, or None if this draw failed."""
    start = rng.randint(*START_RANGE)
    x, operands = start, []
    for op in ops:
        n = _operand(rng, op, x)
        if n is None:
            return None
        operands.append(n)
        x = _apply(op, x, n)
    return start, operands


def _arith_plan(rng: random.Random) -> tuple[list[str], tuple[int, list[int]]]:
    """Operations and numbers that satisfy every range and exactness rule.

    Division needs a value with a divisor in FACTOR_RANGE, so numbers are
    redrawn a few times; some sequences (two divisions in a row) can never
    work, hence the operations are redrawn too.
    """
    while True:
        ops = [rng.choice(tuple(OP_TEMPLATES)) for _ in range(rng.randint(1, 3))]
        for _ in range(NUMBER_ATTEMPTS):
            numbers = _arith_numbers(rng, ops)
            if numbers is not None:
                return ops, numbers


def make_arithmetic(rng: random.Random) -> Problem:
    """A 1-3 step word problem about one person and one kind of object."""
    ops, numbers = _arith_plan(rng)
    start, operands = numbers
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)

    sentences = [rng.choice(START_TEMPLATES).format(name=name, n=start, obj=obj)]
    steps, x = [], start
    for op, n in zip(ops, operands):
        sentences.append(rng.choice(OP_TEMPLATES[op]).format(name=name, n=n, obj=obj))
        y = _apply(op, x, n)
        steps.append(STEP_TEMPLATES[op].format(name=name, x=x, n=n, work=_work(op, x, n)))
        x = y
    sentences.append(rng.choice(QUESTION_TEMPLATES).format(name=name, obj=obj))

    key = " ".join([str(start)] + [f"{SYMBOLS[op]}{n}" for op, n in zip(ops, operands)])
    return Problem("arithmetic", f"arithmetic:{key}", " ".join(sentences), tuple(steps), str(x))


# --------------------------------------------------------------------------
# Unit conversions
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversion:
    """``1 big = factor small``, e.g. 1 kilometer = 1000 meters."""

    big: str
    bigs: str  # plural
    smalls: str  # plural (the factor is always > 1)
    factor: int


CONVERSIONS = (
    Conversion("kilometer", "kilometers", "meters", 1000),
    Conversion("meter", "meters", "centimeters", 100),
    Conversion("centimeter", "centimeters", "millimeters", 10),
    Conversion("kilogram", "kilograms", "grams", 1000),
    Conversion("ton", "tons", "kilograms", 1000),
    Conversion("liter", "liters", "milliliters", 1000),
    Conversion("hour", "hours", "minutes", 60),
    Conversion("minute", "minutes", "seconds", 60),
    Conversion("day", "days", "hours", 24),
    Conversion("week", "weeks", "days", 7),
    Conversion("year", "years", "months", 12),
    Conversion("dollar", "dollars", "cents", 100),
    Conversion("foot", "feet", "inches", 12),
    Conversion("yard", "yards", "feet", 3),
)
UNIT_TEMPLATES = (
    "How many {dst} are in {v} {src}?",
    "Convert {v} {src} to {dst}.",
    "What is {v} {src} in {dst}?",
    "Express {v} {src} in {dst}.",
    "{v} {src} is how many {dst}?",
    "{name} has a total of {v} {src}. How many {dst} is that?",
    "{name} writes {v} {src} in {dst}. What number does {name} get?",
    "Change {v} {src} into {dst}.",
)


def make_units(rng: random.Random) -> Problem:
    """Convert a whole number of units up or down; the result is exact."""
    conv = rng.choice(CONVERSIONS)
    # Keep the larger number of the pair at most MAX_VALUE, like arithmetic.
    big_count = rng.randint(2, min(99, MAX_VALUE // conv.factor))
    small_count = big_count * conv.factor
    rule = f"1 {conv.big} = {conv.factor} {conv.smalls}"
    if rng.random() < 0.5:  # big -> small: multiply
        v, src, dst, answer = big_count, conv.bigs, conv.smalls, small_count
        step = f"{rule}, so {v} * {conv.factor} = {answer}."
    else:  # small -> big: divide
        v, src, dst, answer = small_count, conv.smalls, conv.bigs, big_count
        step = f"{rule}, so {v} / {conv.factor} = {answer}."
    question = rng.choice(UNIT_TEMPLATES).format(v=v, src=src, dst=dst, name=rng.choice(NAMES))
    return Problem("units", f"units:{v} {src}->{dst}", question, (step,), str(answer))


# --------------------------------------------------------------------------
# List manipulation
# --------------------------------------------------------------------------

LIST_TEMPLATES = {
    "sort_asc": (
        "Sort these numbers from smallest to largest: {lst}.",
        "Put {lst} in increasing order.",
        "Arrange the numbers {lst} in ascending order.",
        "{name} has cards showing {lst}. Sort them from smallest to largest.",
    ),
    "sort_desc": (
        "Sort these numbers from largest to smallest: {lst}.",
        "Put {lst} in decreasing order.",
        "Arrange the numbers {lst} in descending order.",
        "{name} has cards showing {lst}. Sort them from largest to smallest.",
    ),
    "reverse": (
        "Reverse the list {lst}.",
        "Write {lst} in reverse order.",
        "{name} reads {lst} from last to first. What list does {name} get?",
        "What is {lst} backwards?",
    ),
    "max": (
        "What is the largest number in {lst}?",
        "Find the maximum of {lst}.",
        "Which number in {lst} is the biggest?",
        "{name} scored {lst} in a game. What was the best score?",
    ),
    "min": (
        "What is the smallest number in {lst}?",
        "Find the minimum of {lst}.",
        "Which number in {lst} is the smallest?",
        "{name} timed laps of {lst} seconds. What was the fastest lap?",
    ),
    "sum": (
        "What is the sum of {lst}?",
        "Add up the numbers {lst}.",
        "Find the total of {lst}.",
        "{name} buys items costing {lst} dollars. What is the total cost?",
    ),
}


def format_list(values: list[int]) -> str:
    """The canonical list form used in questions and answers: ``[1, 2, 3]``."""
    return "[" + ", ".join(str(v) for v in values) + "]"


def _list_steps(op: str, values: list[int]) -> tuple[tuple[str, ...], str]:
    """Solution lines and answer for one list operation."""
    if op in ("sort_asc", "sort_desc", "reverse"):
        result = {
            "sort_asc": sorted(values),
            "sort_desc": sorted(values, reverse=True),
            "reverse": values[::-1],
        }[op]
        label = {
            "sort_asc": "From smallest to largest",
            "sort_desc": "From largest to smallest",
            "reverse": "From last to first",
        }[op]
        return (f"{label}: {', '.join(map(str, result))}.",), format_list(result)
    if op in ("max", "min"):
        best = max(values) if op == "max" else min(values)
        word = "largest" if op == "max" else "smallest"
        return (f"The {word} number in {format_list(values)} is {best}.",), str(best)
    steps, total = [], values[0]  # sum: one running-total line per addition
    for v in values[1:]:
        steps.append(f"{total} + {v} = {total + v}.")
        total += v
    return tuple(steps), str(total)


def make_lists(rng: random.Random) -> Problem:
    """An operation on 4-7 two-digit numbers (3-5 for sums, to stay short)."""
    op = rng.choice(tuple(LIST_TEMPLATES))
    length = rng.randint(3, 5) if op == "sum" else rng.randint(4, 7)
    values = [rng.randint(10, 99) for _ in range(length)]
    question = rng.choice(LIST_TEMPLATES[op]).format(lst=format_list(values), name=rng.choice(NAMES))
    steps, answer = _list_steps(op, values)
    return Problem("lists", f"lists:{op}:{format_list(values)}", question, steps, answer)


# --------------------------------------------------------------------------
# Sampling, splits and the public interface
# --------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[random.Random], Problem]] = {
    "arithmetic": make_arithmetic,
    "units": make_units,
    "lists": make_lists,
}


def split_of(key: str) -> str:
    """The split a problem key belongs to, from a stable SHA-256 hash."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0 else "train"


def _family_schedule(n: int, rng: random.Random) -> list[str]:
    """Exactly-proportioned family labels (largest remainder), shuffled."""
    quotas = [(family, n * weight) for family, weight in FAMILY_WEIGHTS]
    counts = {family: int(q) for family, q in quotas}
    by_remainder = sorted(quotas, key=lambda fq: fq[1] - int(fq[1]), reverse=True)
    for family, _ in by_remainder[: n - sum(counts.values())]:
        counts[family] += 1
    labels = [family for family, _ in FAMILY_WEIGHTS for _ in range(counts[family])]
    rng.shuffle(labels)
    return labels


def _draw(family: str, rng: random.Random, split: str, seen: set[str]) -> Problem:
    """A new problem of ``family`` in ``split`` whose question is unseen."""
    for _ in range(MAX_ATTEMPTS):
        problem = GENERATORS[family](rng)
        # Wrong-split and duplicate problems are rejected and redrawn.
        if split_of(problem.key) == split and problem.question not in seen:
            seen.add(problem.question)
            return problem
    raise ValueError(
        f"could not draw a new {family!r} example for split {split!r} after "
        f"{MAX_ATTEMPTS} attempts; ask for fewer examples"
    )


def make_examples(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` distinct chat examples, deterministic per (n, seed, split).

    Each dict has ``messages`` (user question, assistant solution),
    ``answer`` (str) and ``family`` (str). Train and eval never share a
    problem (see the module docstring).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    # A string seed is hashed with SHA-512 by random, so it is stable across runs.
    rng = random.Random(f"mars-synthetic:{split}:{seed}")
    seen: set[str] = set()
    return [_draw(family, rng, split, seen).to_example() for family in _family_schedule(n, rng)]


# --------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _show(examples: list[dict]) -> None:
    """Print examples in a readable form."""
    for i, ex in enumerate(examples):
        print(f"--- example {i} ({ex['family']}, answer {ex['answer']})")
        for message in ex["messages"]:
            print(f"[{message['role']}]\n{message['content']}")
        print()


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m tasks.synthetic``."""
    parser = argparse.ArgumentParser(
        prog="python -m tasks.synthetic",
        description="Generate seeded synthetic chat examples (arithmetic 60%, "
        "units 20%, lists 20%). Solutions end in the line '#### <answer>'.",
    )
    parser.add_argument("--n", type=int, default=1000, help="number of examples (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--split", choices=SPLITS, default="train", help="train or eval (disjoint)")
    parser.add_argument("--output", help="write JSONL here (one example per line)")
    parser.add_argument("--show", type=int, default=0, metavar="K", help="print the first K examples")
    args = parser.parse_args(argv)
    if args.n < 0 or args.show < 0:
        parser.error("--n and --show must be non-negative")

    examples = make_examples(args.n, args.seed, args.split)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            for ex in examples:
                f.write(json.dumps(ex, ensure_ascii=False) + "\n")
        print(f"wrote {len(examples)} {args.split} examples to {args.output}", file=sys.stderr)
    if args.show:
        _show(examples[: args.show])
    if not args.output and not args.show:
        for ex in examples:
            print(json.dumps(ex, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
