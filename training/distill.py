"""Self-distillation: the base model's own greedy answers to our prompts, as MARS training targets.

Each output line is one prompt's record: its chat-formatted prompt ids, the generated ids exactly
as the decoder produced them (re-tokenising the text could differ, and the masks must learn the
model's own token sequence), the text, and whether the answer ended (EOS) or hit the cap. The file
grows a batch at a time and a rerun skips the ids already there, so an interrupted run resumes.

    python -m training.distill --model smollm2-135m-instruct --prompts data/smollm2/prompts.jsonl \
        --out data/smollm2/distill.jsonl --max-new-tokens 192 --batch-size 16
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mars_core import DecodeConfig, load_model
from mars_core.generate import decode_steps
from mars_core.prompts import encode_prompt


def read_prompts(path: str) -> list[dict]:
    """`{"id", "prompt"}` records of a JSONL file, with a clear message for a bad line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out.append({"id": rec["id"], "prompt": str(rec["prompt"])})
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: expected a JSON object with 'id' and 'prompt' ({e})") from None
    return out


def done_ids(path: str) -> set:
    if not os.path.isfile(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def distill(model, tokenizer, prompts: list[dict], out: str, max_new_tokens: int, batch_size: int, log=print) -> int:
    """Append one record per prompt not yet in `out`; returns how many were written."""
    done = done_ids(out)  # once: read per prompt, a resumed run of 2,000 spent minutes here
    todo = [p for p in prompts if p["id"] not in done]
    config = DecodeConfig(mode="ar", cache="cursor", max_new_tokens=max_new_tokens)
    written, start = 0, time.time()
    for i in range(0, len(todo), batch_size):
        batch = todo[i:i + batch_size]
        ids = [encode_prompt(tokenizer, p["prompt"]) for p in batch]
        rows, steps = decode_steps(model, tokenizer, ids, config)
        for _ in steps:
            pass
        with open(out, "a", encoding="utf-8") as f:
            for p, prompt_ids, gen in zip(batch, ids, rows.out):
                ended = len(gen) < max_new_tokens
                f.write(json.dumps({"id": p["id"], "prompt": p["prompt"], "prompt_ids": prompt_ids,
                                    "response_ids": gen, "ended": ended,
                                    "response": tokenizer.decode(gen, skip_special_tokens=True)}) + "\n")
        written += len(batch)
        tokens = sum(len(g) for g in rows.out)
        log(f"{written}/{len(todo)} prompts, last batch {tokens} tokens, {time.time() - start:.0f} s")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prompts = read_prompts(args.prompts)[: args.limit]
        model, tokenizer = load_model(args.model, dtype="float32")
    except ValueError as e:
        print(f"error: {e}")
        return 2
    with torch.inference_mode():
        distill(model, tokenizer, prompts, args.out, args.max_new_tokens, args.batch_size,
                log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
