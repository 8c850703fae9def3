"""Lossless MARS: which mask-group layout pays? Tokens per forward and wall-clock, measured.

    flock /tmp/cpu-bench.lock python -m benchmarks.lossless_layouts --n 64 --batch-sizes 1,4,16

A lossless step forwards [new real tokens | k drafts | mask groups] (`DecodeConfig.draft_groups`):

  all    one group of B - 1 masks after every possible accept count j = 0..k: new drafts
         whatever j is; width n + k + (k + 1)(B - 1) (16 at B = 4)
  last   one group, after d_k: new drafts only when every draft was accepted, otherwise the
         next step has none (it emits one token); width n + k + (B - 1) (7 at B = 4)
  ends   groups after j = 0 and j = k: width n + k + 2(B - 1) (10 at B = 4)

The output is AR's under every layout (checked here: the script stops if two layouts differ);
only the speed differs. Every layout decodes the same held-out problems, greedy, cursor cache,
interleaved with AR (`mode="ar"`, cursor cache, same model) after a warm-up; the median of the
repetitions is reported.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from mars_core.config import DecodeConfig
from mars_core.generate import decode_steps
from mars_core.lists import list_arg
from mars_core.loading import load_model
from mars_core.prompts import encode_prompt

LAYOUTS = ("all", "last", "ends")


def run(model, tok, prompts: list[list[int]], cfg: DecodeConfig, batch: int):
    """(seconds, outputs, tokens, row forwards) for every prompt, in chunks of `batch`."""
    t0 = time.perf_counter()
    out, tokens, forwards = [], 0, 0
    for i in range(0, len(prompts), batch):
        rows, steps = decode_steps(model, tok, prompts[i:i + batch], cfg)
        for _ in steps:
            pass
        out += rows.out
        tokens += rows.stats.tokens
        forwards += rows.stats.row_forwards
    return time.perf_counter() - t0, out, tokens, forwards


def main(argv=None) -> int:
    from tasks.synthetic import make_examples

    p = argparse.ArgumentParser(prog="python -m benchmarks.lossless_layouts", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="assets/models/tiny-mars-b4")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--batch-sizes", type=list_arg(int, minimum=1), default=(1, 4, 16))
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    prompts = [encode_prompt(tok, ex["messages"][0]["content"]) for ex in make_examples(args.n, 0, "eval")]
    configs = {"ar": DecodeConfig(mode="ar", cache="cursor", max_new_tokens=args.max_new_tokens)}
    for layout in LAYOUTS:
        configs[layout] = DecodeConfig(mode="lossless", block_size=args.block_size, cache="cursor",
                                       max_new_tokens=args.max_new_tokens, draft_groups=layout)
    print(f"{args.n} problems, B = {args.block_size}, max_new_tokens {args.max_new_tokens}, {args.threads} threads, "
          f"median of {args.repeats}\n\n| batch | decoding | T/F | tok/s | vs AR | vs all |\n|---:|---|---:|---:|---:|---:|")
    for batch in args.batch_sizes:
        names = list(configs)
        for name in names:  # warm-up
            run(model, tok, prompts[:batch], configs[name], batch)
        times = {name: [] for name in names}
        counts = {}
        for rep in range(args.repeats):
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                seconds, out, tokens, forwards = run(model, tok, prompts, configs[name], batch)
                times[name].append(seconds)
                counts[name] = (out, tokens, forwards)
        ref = counts["ar"][0]
        for name in names:
            if counts[name][0] != ref:
                raise SystemExit(f"{name} differs from AR: lossless is broken")
        speed = {name: counts[name][1] / statistics.median(times[name]) for name in names}
        for name in names:
            tf = counts[name][1] / counts[name][2]
            label = "AR (cursor)" if name == "ar" else f"lossless, groups {name}"
            print(f"| {batch} | {label} | {tf:.2f} | {speed[name]:.0f} | {speed[name] / speed['ar']:.2f}x | "
                  f"{speed[name] / speed['all']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
