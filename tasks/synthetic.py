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

The families' templates and generators live in :mod:`tasks.families`, the scorer in
:mod:`tasks.scoring`; this module mixes, splits and serves them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys

from tasks.families import ANSWER_PREFIX, GENERATORS, Problem
from tasks.scoring import extract_answer, score

__all__ = ["ANSWER_PREFIX", "SPLITS", "extract_answer", "make_examples", "score", "split_of"]

SPLITS = ("train", "eval")
# Fixed family proportions; counts per call are rounded by largest remainder.
FAMILY_WEIGHTS = (("arithmetic", 0.6), ("units", 0.2), ("lists", 0.2))
# One hash bucket out of EVAL_BUCKETS belongs to eval, the rest to train.
EVAL_BUCKETS = 10
# Draws allowed per example before giving up (the problem space is exhausted).
MAX_ATTEMPTS = 10_000


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
