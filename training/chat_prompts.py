"""Our own chat prompts for the real model's MARS stage: seeded templates x subjects, no data set.

The prompts span what an assistant is asked (explain, list, compare, write, rewrite, plan, code,
reason, convert, define, advise, role-play) so that the masks learn general continuations, not
one category's. Prompts that hand the model a text (summaries, retrieved passages, translation,
extraction) are made from the base's own answers by `training.context_prompts`. Nothing here is
copied from a prompt set, so it can be committed and regenerated bit for bit: `make_prompts(n,
seed)` is a pure function.

    python -m training.chat_prompts --n 2000 --seed 0 --out data/smollm2/prompts.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import random

SUBJECTS = """photosynthesis; the water cycle; black holes; volcanoes; earthquakes; the immune system; vaccines;
DNA; climate change; renewable energy; solar panels; wind turbines; electric cars; batteries; the internet;
email; passwords; cloud storage; machine learning; neural networks; databases; spreadsheets; the stock market;
inflation; interest rates; budgeting; saving money; credit cards; taxes; small businesses; marketing;
job interviews; public speaking; time management; remote work; teamwork; leadership; negotiation; sleep;
exercise; running; yoga; healthy eating; vitamins; drinking water; coffee; tea; bread; pasta; rice; vegetables;
fruit; gardening; houseplants; composting; recycling; bees; birds; dogs; cats; horses; whales; sharks; forests;
deserts; oceans; rivers; mountains; the moon; Mars; the sun; stars; comets; gravity; magnets; electricity;
light; sound; heat; friction; atoms; chemical reactions; acids and bases; the periodic table; fractions;
percentages; prime numbers; geometry; probability; statistics; the Roman Empire; ancient Egypt; the printing
press; the Industrial Revolution; the Renaissance; democracy; elections; human rights; museums; libraries;
reading; writing a diary; learning a language; music; the piano; the guitar; painting; photography; films;
theatre; chess; football; basketball; tennis; swimming; cycling; hiking; camping; travel; airports; trains;
bridges; skyscrapers; cities; villages; traffic; maps; weather forecasts; rain; snow; storms; rainbows;
friendship; kindness; patience; curiosity; motivation; stress; meditation; cooking at home; baking a cake;
making soup; cleaning the kitchen; moving house; buying a laptop; smartphones; social media; video games;
robots; 3D printing; space travel; satellites; GPS; microscopes; telescopes; the human heart; the brain; bones;
teeth; the skin; allergies; the common cold; first aid; a birthday party; a wedding; a school trip; homework;
exams; teachers; university; online courses; open source software; Python; JavaScript; version control;
unit tests; debugging; algorithms; sorting; recursion""".replace("\n", " ")

TEMPLATES = [
    "Explain {s} in simple terms.",
    "What is {s}?",
    "Give me three interesting facts about {s}.",
    "Why is {s} important?",
    "Explain {s} to a ten-year-old.",
    "Write a short paragraph about {s}.",
    "List five things everyone should know about {s}.",
    "What are the advantages and disadvantages of {s}?",
    "Write a haiku about {s}.",
    "Write a short poem about {s}.",
    "Write a short story that involves {s}.",
    "Write a friendly email to a colleague about {s}.",
    "Give me some tips about {s}.",
    "How can a beginner learn about {s}?",
    "What are common misconceptions about {s}?",
    "Describe {s} in two sentences.",
    "Write a tweet about {s}.",
    "Write a title and a one-sentence summary for a blog post about {s}.",
    "Create a quiz question about {s} with the answer.",
    "What questions could a student ask about {s}?",
    "Pretend you are a teacher. Introduce today's lesson on {s}.",
    "You are a tour guide. Say a few words about {s}.",
    "Write a short dialogue between two friends talking about {s}.",
    "Compare {s} and {t}.",
    "What do {s} and {t} have in common?",
    "Write a sentence that mentions both {s} and {t}.",
    "Make a to-do list for a weekend project about {s}.",
    "Summarize the history of {s} in a few sentences.",
    "What is the most surprising thing about {s}?",
    "Give an example that shows how {s} works.",
]

WORDS = ("apple river quiet brave seven window garden yellow thunder pencil silver market ocean whisper "
         "candle journey forest rocket mirror blanket").split()


def _arithmetic(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    return rng.choice([
        f"What is {a} + {b}?", f"What is {a} times {c}?", f"What is {a * c} divided by {c}?",
        f"A shop sells pens for {c} dollars each. How much do {a} pens cost?",
        f"Tom has {a} marbles and gives away {min(a, b) // 2}. How many does he have left?",
        f"A train travels {a} km per hour for {c} hours. How far does it go?",
        f"Is {a} an even or odd number? Explain.",
        f"What is {c} squared plus {b}?",
    ])


def _coding(rng: random.Random) -> str:
    task = rng.choice([
        "reverses a string", "checks whether a number is prime", "returns the largest item of a list",
        "counts the vowels in a string", "computes the factorial of n", "removes duplicates from a list",
        "returns the n-th Fibonacci number", "converts Celsius to Fahrenheit", "sums the even numbers in a list",
        "checks whether a word is a palindrome", "sorts a list of names alphabetically",
        "returns the average of a list of numbers",
    ])
    return rng.choice([f"Write a Python function that {task}.", f"How would you write code that {task}?",
                       f"Write a JavaScript function that {task}."])


def _words(rng: random.Random) -> str:
    w = rng.sample(WORDS, 3)
    return rng.choice([
        f"Write a sentence using the words {w[0]}, {w[1]} and {w[2]}.",
        f"Give a synonym and an antonym of the word '{w[0]}'.",
        f"Put these words in alphabetical order: {', '.join(w)}.",
        f"Write a rhyme with the word '{w[0]}'.",
        f"Rewrite this sentence to sound more formal: 'hey, can you send me the {w[0]} thing asap?'",
        f"Fix the grammar: 'She don't like the {w[0]} and they was late.'",
    ])


def make_prompts(n: int, seed: int) -> list[str]:
    """`n` distinct prompts, the same for the same (n, seed): mostly templates x subjects, a
    fifth arithmetic, code and word tasks."""
    subjects = [s.strip() for s in SUBJECTS.split(";") if s.strip()]

    def draw(rng: random.Random) -> str:
        kind = rng.random()
        if kind < 0.08:
            return _arithmetic(rng)
        if kind < 0.14:
            return _coding(rng)
        if kind < 0.2:
            return _words(rng)
        s, t = rng.sample(subjects, 2)
        p = rng.choice(TEMPLATES).format(s=s, t=t)
        return p[0].upper() + p[1:]

    return distinct(draw, n, random.Random(seed), f"with seed {seed}")


def distinct(draw, n: int, rng: random.Random, source: str) -> list[str]:
    """The first `n` distinct results of `draw(rng)`, in the order drawn (at most 50 n draws)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    seen, out = set(), []
    for _ in range(n * 50):
        if len(out) == n:
            break
        p = draw(rng)
        if p not in seen:
            seen.add(p)
            out.append(p)
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct prompts can be made {source}; ask for fewer")
    return out


def write_prompt_file(path: str, prompts: list[str], first_id: int = 0) -> None:
    """`prompts` as JSONL records {"id", "prompt"}, ids from `first_id`, written whole or not at all."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for i, prompt in enumerate(prompts):
            f.write(json.dumps({"id": first_id + i, "prompt": prompt}) + "\n")
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    write_prompt_file(args.out, make_prompts(args.n, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
