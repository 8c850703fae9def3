"""More of the base's answers for the gated stage, on a CPU, in one resumable command.

    python -m training.more_answers --out runs/more && python -m training.gated_stage \
        --data data/smollm2/distill.jsonl runs/more/distill-0.jsonl runs/more/distill-1.jsonl --first 5251 ...

1. prompts: `make_prompts(n, seed)` (seed 1: the committed 2,400 are seed 0) minus those already in
   the committed set, with ids from 100000 up (clear of the committed ids; every 20th is still held
   out, `frozen_stage.holdout`), written once to OUT/prompts.jsonl;
2. split once into `--workers` contiguous shares (OUT/prompts-K.jsonl), each distilled by its own
   `training.distill` process of one thread to OUT/distill-K.jsonl. On this project's 2-core CPU
   two such processes distil about 17 prompts a minute each, and one process of two threads about
   14: 2.4 times the work (docs/smollm2.md).

With `--contexts FILE...` the prompts of step 1 hand the model one of the base's answers to work on
(`training.context_prompts`: summaries, questions over passages, translation, extraction), ids from
200000:

    python -m training.more_answers --out runs/context --n 2400 --seed 0 \
        --contexts data/smollm2/distill.jsonl runs/more/distill-0.jsonl runs/more/distill-1.jsonl

With `--tasks` they are code, factual questions, word problems and puzzles (`training.task_prompts`),
ids from 300000:

    python -m training.more_answers --out runs/tasks --n 1200 --seed 0 --tasks

Nothing is lost to a stop: a rerun of the same command skips the answers written (the split is
kept, so a changed `--workers` cannot give one prompt to two files). It returns 0 only when every
share is complete, so the stage after `&&` starts on a fixed data set.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from training.distill import done_ids, read_prompts

FIRST_ID = 100_000


def write_prompts(out: str, n: int, seed: int, exclude: str | None, contexts: list[str] | None = None,
                  tasks: bool = False) -> list[dict]:
    """OUT/prompts.jsonl, made once: the generator's prompts not in `exclude`, ids from FIRST_ID; or,
    with `contexts` (distill files), prompts over their answers (`training.context_prompts`), ids
    from FIRST_CONTEXT_ID; or, with `tasks`, `training.task_prompts`'s, ids from its FIRST_ID."""
    from training.chat_prompts import make_prompts
    from training.context_prompts import FIRST_ID as FIRST_CONTEXT_ID, make_context_prompts, read_answers, usable

    path = os.path.join(out, "prompts.jsonl")
    if not os.path.isfile(path):
        if tasks:
            from training.task_prompts import FIRST_ID as FIRST_TASK_ID, make_task_prompts
            made, first = make_task_prompts(n, seed), FIRST_TASK_ID
        elif contexts:
            made, first = make_context_prompts(usable(read_answers(contexts)), n, seed), FIRST_CONTEXT_ID
        else:
            old = {r["prompt"] for r in read_prompts(exclude)} if exclude else set()
            made, first = [q for q in make_prompts(n, seed) if q not in old], FIRST_ID
        _write(path, [{"id": first + i, "prompt": p} for i, p in enumerate(made)])
    return read_prompts(path)


def shares(out: str, prompts: list[dict], workers: int) -> list[str]:
    """The share files, split into `workers` contiguous parts the first time and kept after."""
    kept = sorted((f for f in os.listdir(out) if f.startswith("prompts-") and f.endswith(".jsonl")),
                  key=lambda f: int(f[len("prompts-"):-len(".jsonl")]))  # numeric: share 10 after share 9
    if kept:
        return [os.path.join(out, f) for f in kept]
    size = -(-len(prompts) // workers)
    paths = [os.path.join(out, f"prompts-{k}.jsonl") for k in range(workers)]
    for k, path in enumerate(paths):
        _write(path, prompts[k * size:(k + 1) * size])
    return paths


def _write(path: str, rows: list[dict]) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=4000, help="prompts asked of the generator (before the committed ones go)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--exclude", default="data/smollm2/prompts.jsonl", help="a prompt file whose prompts are left out")
    p.add_argument("--contexts", nargs="+", default=None, help="distill files: ask for prompts over their answers "
                   "(summaries, passages, translation, extraction) instead of the generator's")
    p.add_argument("--tasks", action="store_true", help="ask for code, factual questions, word problems and "
                   "puzzles (training.task_prompts) instead of the generator's")
    p.add_argument("--workers", type=int, default=2, help="distill processes of one thread each")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=192)
    args = p.parse_args(argv)
    if args.workers < 1 or args.n < 1:
        print("error: --workers and --n must be at least 1")
        return 2
    if args.tasks and args.contexts:
        print("error: --tasks and --contexts make two kinds of prompts: give each its own --out and run")
        return 2
    os.makedirs(args.out, exist_ok=True)
    try:
        prompts = write_prompts(args.out, args.n, args.seed, args.exclude, args.contexts, args.tasks)
        parts = shares(args.out, prompts, args.workers)
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 2
    outputs = [os.path.join(args.out, f"distill-{k}.jsonl") for k in range(len(parts))]
    jobs = []
    for k, (part, out) in enumerate(zip(parts, outputs)):
        if not {r["id"] for r in read_prompts(part)} - done_ids(out):
            continue  # complete: no process (and no model load) for it
        with open(os.path.join(args.out, f"log-{k}.txt"), "a", encoding="utf-8") as log:
            jobs.append(subprocess.Popen([sys.executable, "-m", "training.distill", "--model", args.model, "--prompts", part,
                                          "--out", out, "--batch-size", str(args.batch_size), "--max-new-tokens",
                                          str(args.max_new_tokens), "--threads", "1"], stdout=log, stderr=subprocess.STDOUT))
    codes = [job.wait() for job in jobs]
    left = sum(len({r["id"] for r in read_prompts(part)} - done_ids(out)) for part, out in zip(parts, outputs))
    print(f"{len(prompts) - left} of {len(prompts)} answers in {args.out}" + (f"; distill exit codes {codes}" if any(codes) else ""))
    return 0 if left == 0 and not any(codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
