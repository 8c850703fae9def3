"""Prompts that hand the model a text to work on, built from the base's own answers: no data set.

The template generator (`chat_prompts`) asks for text from nothing. Half of Spec-Bench, and much of
self-instruct, gives the model a text and asks for something made of it: summarise an article,
answer from retrieved passages, translate a sentence, pull facts or a title out of a paragraph. The
answers there copy and condense their context, which masks trained only on free writing have never
seen. The contexts here are the base's answers to template prompts (a `training.distill` file), so
nothing is copied from a prompt set, and `make_context_prompts(passages, n, seed)` is a pure function:
the same committed answers and seed give the same prompts.

Only answers the gated stage trains on are used as contexts (`frozen_stage`'s held-out ids, every
20th, are left out): a held-out answer pasted into a training prompt would be learnt as context and
copied by the answer, and the held-out replay would no longer measure unseen text.

    python -m training.context_prompts --answers data/smollm2/distill.jsonl --n 1000 --seed 0 \
        --out runs/context/prompts.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import re

from training.chat_prompts import distinct, write_prompt_file

FIRST_ID = 200_000  # context prompts' ids: clear of the committed set (0..) and the generator's more (100000..)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch")

SUMMARISE = (
    "Summarize: {p}", "Summarize the following text in a few sentences.\n\n{p}",
    "Write a one-sentence summary of this text:\n\n{p}", "{p}\n\nSummarize the text above in two sentences.",
    "Give a short summary of this article.\n\n{p}", "What is the main idea of this text?\n\n{p}",
)
ASK = (
    "{c}\n\nAnswer the question using the passages above: {q}",
    "Read the passages below and answer the question.\n\n{c}\n\nQuestion: {q}",
    "Context:\n{c}\n\nBased on the context, {q_lower}",
    "{c}\n\n{q}",
)
TRANSLATE = (
    "Translate English to {l}: {s}", "Translate the following sentence into {l}.\n{s}",
    "How do you say this in {l}? \"{s}\"", "Translate to {l}:\n\n{s}",
)
EXTRACT = (
    "Extract the key facts from this text as a bulleted list.\n\n{p}", "Give this text a title.\n\n{p}",
    "List the most important words in this paragraph.\n\n{p}", "Rewrite this text in a more formal tone.\n\n{p}",
    "Turn this text into three quiz questions with answers.\n\n{p}",
    "{p}\n\nWhat are the three most important points of this text?",
    "Rewrite the following text so that a child can understand it.\n\n{p}",
    "Is the tone of this text positive, negative or neutral? Explain briefly.\n\n{p}",
)
CONTEXT_WORDS = 220  # about 310 tokens: with the question, 100 or more of the stage's 448-token examples are answer
KINDS = (("summarise", 0.3), ("ask", 0.3), ("translate", 0.2), ("extract", 0.2))


def usable(records: list[dict], max_words: int = 220) -> list[dict]:
    """Answers fit to be a context: trained on (not a held-out id), 20 to `max_words` words, not one
    line said over and over; an answer cut at the cap ends at its last full sentence."""
    out = []
    for r in records:
        text = r["response"].strip()
        if not r.get("ended"):
            text = text[: max(text.rfind(". "), text.rfind(".\n")) + 1]
        words = text.split()
        if r["id"] % 20 and 20 <= len(words) <= max_words and len(set(words)) >= 0.4 * len(words):
            out.append({**r, "response": text})
    return out


def sentences(text: str) -> list[str]:
    """The plain sentences of a text (6 to 30 words, no list markers or code), to translate."""
    out = []
    for s in re.split(r"(?<=[.!?])\s+", text.replace("\n", " ")):
        s = s.strip()
        if 6 <= len(s.split()) <= 30 and not re.search(r"[`*#|_{}\[\]<>]|^\d+\.", s):
            out.append(s)
    return out


def _words(record: dict) -> int:
    return len(record["response"].split())


def _question(prompt: str) -> bool:
    return prompt.endswith("?") and len(prompt.split()) <= 16


def make_context_prompts(passages: list[dict], n: int, seed: int) -> list[str]:
    """`n` distinct prompts over `passages` (`usable` records of a distill file): summaries, questions
    over 2 to 4 retrieved passages (one answers it), translations of one sentence, and extraction."""
    questions = [r for r in passages if _question(r["prompt"])]
    lines = [s for r in passages for s in sentences(r["response"])]
    if len(passages) < 4 or not questions or not lines:
        raise ValueError(f"{len(passages)} answers are too few to build contexts from; give a distill file "
                         "with at least a few hundred ended answers")
    kinds, weights = zip(*KINDS)

    def draw(rng: random.Random) -> str:
        kind = rng.choices(kinds, weights)[0]
        if kind == "summarise":
            return rng.choice(SUMMARISE).format(p=rng.choice(passages)["response"].strip())
        if kind == "extract":
            return rng.choice(EXTRACT).format(p=rng.choice(passages)["response"].strip())
        if kind == "translate":
            return rng.choice(TRANSLATE).format(l=rng.choice(LANGUAGES), s=rng.choice(lines))
        q = rng.choice(questions)
        docs = [q]
        for other in rng.sample(passages, 3)[: rng.randint(1, 3)]:
            if other is not q and sum(_words(d) for d in docs) + _words(other) <= CONTEXT_WORDS:
                docs.append(other)
        rng.shuffle(docs)
        context = "\n\n".join(f"Passage {i + 1}: {d['response'].strip()}" for i, d in enumerate(docs))
        return rng.choice(ASK).format(c=context, q=q["prompt"], q_lower=q["prompt"][0].lower() + q["prompt"][1:])

    return distinct(draw, n, random.Random(seed), f"from {len(passages)} answers")


def read_answers(paths: list[str]) -> list[dict]:
    """The records of distill files, with a clear message for a line that is not one."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    out.append({"id": int(r["id"]), "prompt": str(r["prompt"]), "response": str(r["response"]),
                                "ended": bool(r["ended"])})
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{number}: not a distill record ({type(e).__name__}: {e})") from None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--answers", nargs="+", required=True, help="training.distill files whose answers become contexts")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-id", type=int, default=FIRST_ID)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        prompts = make_context_prompts(usable(read_answers(args.answers)), args.n, args.seed)
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 2
    write_prompt_file(args.out, prompts, args.first_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
