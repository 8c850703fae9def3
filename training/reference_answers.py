"""Reference answers as MARS training records: the other kind of target, beside self-distillation.

Reads a JSONL file of `{"question", "answer"}` records in GSM8K's format (openai/grade-school-math,
MIT; brought in with the search tool's `fetch`, read from a path, never committed) and writes the
records `training.distill` writes, with the human-written answer as the response: calculator
annotations `<<48/2=24>>` removed and the final `#### 72` line written as `The answer is 72.` Used
by the data comparison in docs/smollm2.md (which targets teach the masks more per CPU-hour).

    python -m training.reference_answers --gsm8k train.jsonl --limit 200 --first-id 100001 \
        --out runs/gsm/reference.jsonl
"""
from __future__ import annotations

import argparse
import json
import re

from mars_core import load_model
from mars_core.prompts import encode_prompt


def clean_answer(answer: str) -> str:
    """GSM8K's answer text as prose: no calculator annotations, the final answer as a sentence."""
    text = re.sub(r"<<[^>]*>>", "", answer)
    body, sep, final = text.rpartition("####")
    if sep:
        text = f"{body.rstrip()}\nThe answer is {final.strip()}."
    return text.strip()


def records(tokenizer, rows: list[dict], first_id: int):
    for i, row in enumerate(rows):
        response = clean_answer(row["answer"])
        yield {"id": first_id + i, "prompt": row["question"], "prompt_ids": encode_prompt(tokenizer, row["question"]),
               "response_ids": tokenizer(response, add_special_tokens=False)["input_ids"], "ended": True,
               "response": response}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gsm8k", required=True, help="a JSONL file of {question, answer} records")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct", help="whose tokenizer and chat template")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--first-id", type=int, default=0)
    p.add_argument("--prompts-out", default=None, help="also write the questions as a prompts file for training.distill")
    args = p.parse_args(argv)
    with open(args.gsm8k, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()][: args.limit]
    _, tokenizer = load_model(args.model, dtype="float32")
    with open(args.out, "w", encoding="utf-8") as f:
        for rec in records(tokenizer, rows, args.first_id):
            f.write(json.dumps(rec) + "\n")
    if args.prompts_out:
        with open(args.prompts_out, "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                f.write(json.dumps({"id": args.first_id + i, "prompt": row["question"]}) + "\n")
    print(f"{len(rows)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
