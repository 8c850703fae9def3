"""Prompts of the kinds the template generator covers thinly: code, factual questions, word problems.

`chat_prompts` draws most of its prompts from "<template> about <subject>", with 36 coding prompts in
all and factual questions only as "What is X?". On Spec-Bench the shipped gate's masks are weakest on
coding (chain "last" 1.40) and qa (1.47) after translation and summarization, which
`context_prompts` covers (docs/smollm2.md, "Where on Spec-Bench"). This module makes the other
kinds by rule: code to write, explain, fix or test in several languages; questions that ask who,
when, how and why; multi-step word problems with their numbers drawn; short reasoning puzzles. It is
a new generator rather than an edit of `chat_prompts` so that the committed seed-0 prompts stay
what they are. `make_task_prompts(n, seed)` is a pure function.

    python -m training.task_prompts --n 1200 --seed 0 --out runs/tasks/prompts.jsonl
"""
from __future__ import annotations

import argparse
import random

from training.chat_prompts import SUBJECTS, distinct, write_prompt_file

FIRST_ID = 300_000  # task prompts' ids: clear of the committed set (0..), more (100000..), contexts (200000..)

LANGUAGES = ("Python", "Python", "Python", "JavaScript", "Java", "C++", "Go", "Rust")  # Python weighs most, as on Spec-Bench
TASKS = """reverses the words of a sentence; checks whether two strings are anagrams; merges two sorted lists;
finds the second largest number in a list; counts how often each word appears in a text; flattens a nested list;
returns the greatest common divisor of two numbers; converts a binary string to an integer; rotates a list by k
places; checks whether brackets in a string are balanced; returns the longest word in a sentence; capitalizes the
first letter of every word; finds all pairs in a list that sum to a target; computes the median of a list;
validates an email address; removes the vowels from a string; returns the digits of a number in reverse order;
groups a list of words by their first letter; finds the missing number in a list from 1 to n; checks whether a year
is a leap year; converts a temperature table from Celsius to Fahrenheit; returns the n first prime numbers;
computes the dot product of two vectors; transposes a matrix; finds the most common element of a list; splits a
list into chunks of size n; checks whether a list is sorted; computes a running total of a list; implements
binary search; implements bubble sort; implements a stack with push and pop; implements a queue using two stacks;
counts the lines in a text file; reads a CSV file and prints the sum of a column; parses a date string and prints
the weekday; generates a random password; computes compound interest; returns the intersection of two lists;
removes the whitespace at both ends of every line; checks whether a number is a power of two; computes the area
of a circle from its radius; converts a number to Roman numerals; converts Roman numerals to a number; returns
the unique characters of a string in order; computes the Levenshtein distance of two words; finds the longest
common prefix of a list of strings; checks whether a string is a valid IPv4 address; converts seconds into hours,
minutes and seconds; returns a dictionary with the length of each word""".replace("\n", " ")
CODE_FORMS = (
    "Write a {l} function that {t}.", "How do I write a {l} program that {t}?",
    "Write a {l} function that {t}, and explain how it works.", "Show me {l} code that {t}.",
    "Write a {l} function that {t}. Add a short comment and one example.",
    "Write unit tests for a {l} function that {t}.",
    "What is the time complexity of a function that {t}? Give a {l} example.",
)
SNIPPETS = (
    ("def add(a, b):\n    return a - b", "It should add the two numbers."),
    ("for i in range(10):\nprint(i)", "It should print 0 to 9."),
    ("numbers = [1, 2, 3]\nprint(numbers[3])", "It should print the last number."),
    ("def is_even(n):\n    return n % 2 == 1", "It should say whether n is even."),
    ("total = 0\nfor x in [1, 2, 3]:\n    total = x\nprint(total)", "It should print the sum."),
    ("name = input('Name: ')\nprint('Hello ' + Name)", "It should greet the user."),
    ("function square(x) {\n  return x * x\n}\nconsole.log(square('4'))", "Is this correct JavaScript?"),
    ("def average(xs):\n    return sum(xs) / len(xs)\n\nprint(average([]))", "It crashes on an empty list."),
)
SNIPPET_FORMS = ("Find the bug in this code. {h}\n\n{c}", "What does this code do?\n\n{c}",
                 "Fix this code:\n\n{c}\n\n{h}", "Explain this code line by line:\n\n{c}")
CONCEPTS = """a variable; a function; a loop; recursion; a class; an object; inheritance; a list; a dictionary; a hash
table; a linked list; a binary tree; a pointer; an API; a compiler; an interpreter; a database index; a REST API;
a unit test; version control; a merge conflict; an exception; asynchronous code; a thread; a race condition;
big O notation; a regular expression; JSON; a virtual environment; a pull request""".replace("\n", " ")
CONCEPT_FORMS = ("What is {c} in programming?", "Explain {c} with a short code example.",
                 "What is the difference between {c} and {d} in programming?", "When should a programmer use {c}?")
QUESTIONS = (
    "Who first studied {s}?", "How does {s} work?", "Why do people care about {s}?", "Where can I learn more about {s}?",
    "When did {s} become important?", "How has {s} changed over the last hundred years?",
    "What would the world be like without {s}?", "Can {s} be dangerous?", "How do scientists study {s}?",
    "What are the main types of {s}?", "Who benefits most from {s}?", "How does {s} affect everyday life?",
    "What is one fact about {s} that most people get wrong?", "Can you explain how {s} relates to {t}?",
)
NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Lena", "Omar")
ITEMS = (("apples", "bags"), ("pencils", "boxes"), ("cookies", "trays"), ("stickers", "sheets"), ("eggs", "cartons"))


def _word_problem(rng: random.Random) -> str:
    a, b, c = rng.sample(NAMES, 3)
    (thing, pack), n, k = rng.choice(ITEMS), rng.randint(3, 12), rng.randint(2, 9)
    price, hours, speed = rng.randint(2, 15), rng.randint(2, 8), rng.randint(20, 90)
    return rng.choice([
        f"{a} buys {k} {pack} of {thing}. Each has {n} {thing}. {a} gives {b} {k + 1} {thing}. "
        f"How many {thing} does {a} have left?",
        f"{a} earns {price} dollars an hour and works {hours} hours a day for {k} days. How much does {a} earn?",
        f"A car drives at {speed} km per hour for {hours} hours, then at {speed // 2} km per hour for {k} hours. "
        "How far does it go in all?",
        f"{a} is {n + k} years old. {b} is {k} years younger than {a}, and {c} is twice as old as {b}. How old is {c}?",
        f"A class has {n * 3} students. A third of them walk to school and {rng.randint(1, 2 * n - 1)} take the bus. "
        "The rest come by car. "
        "How many come by car?",
        f"{a} reads {n} pages a day. The book has {n * k + 3} pages. How many days does {a} need to finish it?",
        f"A shirt costs {price * 4} dollars and is on sale for 25% off. {a} buys {k} of them. How much does {a} pay?",
        f"{a} has {n * 5} dollars. {a} spends a fifth on lunch and {rng.randint(1, 4 * n - 1)} dollars on a book. "
        "How much is left?",
    ]) + rng.choice(("", " Show your steps.", " Explain your reasoning step by step.", " Let's think step by step."))


def _puzzle(rng: random.Random) -> str:
    a, b, c = rng.sample(NAMES, 3)
    n = rng.randint(3, 9)
    return rng.choice([
        f"{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest?",
        "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain.",
        f"{a} has {n} sisters. Each sister has one brother. How many children are in the family?",
        f"What comes next in the sequence {n}, {2 * n}, {4 * n}, {8 * n}?",
        f"A clock shows {n}:00. What time will it show after {n + 7} hours?",
        f"If it takes {n} machines {n} minutes to make {n} widgets, how long do {n * 10} machines take to make "
        f"{n * 10} widgets?",
        f"{a}, {b} and {c} each own a different pet: a cat, a dog and a fish. {a} is allergic to fur and {b} "
        "walks their pet every morning. Who owns which pet?",
        "Which is heavier, a kilogram of feathers or a kilogram of iron? Why?",
    ])


def make_task_prompts(n: int, seed: int) -> list[str]:
    """`n` distinct prompts, the same for the same (n, seed). Drawn 45% code, 30% questions, 15% word
    problems and 10% puzzles; the few code snippets and puzzles repeat and are drawn again, so of 2,000
    prompts 39% are code."""
    subjects = [s.strip() for s in SUBJECTS.split(";") if s.strip()]
    tasks = [t.strip() for t in TASKS.split(";") if t.strip()]
    concepts = [c.strip() for c in CONCEPTS.split(";") if c.strip()]

    def draw(rng: random.Random) -> str:
        kind = rng.random()
        if kind < 0.3:
            return rng.choice(CODE_FORMS).format(l=rng.choice(LANGUAGES), t=rng.choice(tasks))
        if kind < 0.37:
            code, hint = rng.choice(SNIPPETS)
            return rng.choice(SNIPPET_FORMS).format(c=code, h=hint)
        if kind < 0.45:
            c, d = rng.sample(concepts, 2)
            return rng.choice(CONCEPT_FORMS).format(c=c, d=d)
        if kind < 0.75:
            s, t = rng.sample(subjects, 2)
            p = rng.choice(QUESTIONS).format(s=s, t=t)
            return p[0].upper() + p[1:]
        return _word_problem(rng) if kind < 0.9 else _puzzle(rng)

    return distinct(draw, n, random.Random(seed), f"with seed {seed}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-id", type=int, default=FIRST_ID)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        prompts = make_task_prompts(args.n, args.seed)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    write_prompt_file(args.out, prompts, args.first_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
