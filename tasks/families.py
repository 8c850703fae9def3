"""The three problem families of the synthetic task (arithmetic word problems, unit conversions,
list manipulation): templates, value ranges and one generator per family.

Each generator draws one :class:`Problem` from a ``random.Random``; :mod:`tasks.synthetic` mixes the
families, assigns splits and turns problems into chat examples.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

ANSWER_PREFIX = "####"  # the answer line of every solution: "#### <answer>"
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


GENERATORS: dict[str, Callable[[random.Random], Problem]] = {
    "arithmetic": make_arithmetic,
    "units": make_units,
    "lists": make_lists,
}
