"""training.task_prompts: code, questions, word problems and puzzles by rule, reproducible by seed."""
import random
import re

from training import task_prompts as tp


def test_the_same_seed_gives_the_same_prompts_and_another_seed_others():
    a, b, c = tp.make_task_prompts(400, 0), tp.make_task_prompts(400, 0), tp.make_task_prompts(400, 1)
    assert a == b and a != c and len(set(a)) == 400


def test_the_kinds_come_in_their_stated_shares():
    got = tp.make_task_prompts(2000, 0)
    code = sum(any(w in p for w in ("function", "code", "program", "programming", "programmer")) for p in got)
    word = sum(bool(re.search(r"\d", p)) and "function" not in p and "code" not in p.lower() for p in got)
    assert 0.35 < code / len(got) < 0.5 and 0.10 < word / len(got) < 0.3
    assert not any(re.search(r"\{[a-z]?\}", p) for p in got)  # no slot left unfilled


def test_a_word_problem_never_asks_for_a_negative_rest():
    rules = {  # a problem's pattern -> its rest, from the numbers it states
        r"has (\d+) students\. A third of them walk to school and (\d+) take the bus": lambda a, b: a - a // 3 - b,
        r"has (\d+) dollars\. \w+ spends a fifth on lunch and (\d+) dollars": lambda a, b: a - a // 5 - b,
        r"buys (\d+) \w+ of \w+\. Each has (\d+) \w+\. \w+ gives \w+ (\d+)": lambda a, b, c: a * b - c,
    }
    seen, rng = set(), random.Random(0)
    for p in (tp._word_problem(rng) for _ in range(2000)):
        for pattern, rest in rules.items():
            if m := re.search(pattern, p):
                seen.add(pattern)
                assert rest(*map(int, m.groups())) >= 0, p
    assert seen == set(rules)  # every rule was checked on some problem

