"""The compiled path against the eager one on held-out problems, token for token.

    python -m benchmarks.compiled_check --n 500 --taus 1.0,0.95 --batch-sizes 16

Decodes `tasks.synthetic.make_examples(n, 0, "eval")` greedily with the MARS model on the cursor
cache, eagerly and with `compile=True`, at every tau and batch size asked for, and prints per
run: the share of problems whose output is the same token for token, the accuracy of both, tokens
per forward, and the graphs torch.compile built. The tests check the same on tiny random models;
this is the check on the trained model, over the shapes real prompts give.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from mars_core.config import DecodeConfig
from mars_core.generate import decode_steps
from mars_core.lists import list_arg
from mars_core.loading import load_model, trained_block_size
from mars_core.prompts import encode_prompt


def decode(model, tok, ids: list[list[int]], cfg: DecodeConfig, batch: int):
    """(outputs, tokens per forward, seconds) for every prompt, in chunks of `batch`."""
    out, tokens, forwards, t0 = [], 0, 0, time.perf_counter()
    for i in range(0, len(ids), batch):
        rows, steps = decode_steps(model, tok, ids[i:i + batch], cfg)
        for _ in steps:
            pass
        out += rows.out
        tokens, forwards = tokens + rows.stats.tokens, forwards + rows.stats.row_forwards
    return out, tokens / max(forwards, 1), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from torch._dynamo.utils import counters

    from tasks.synthetic import make_examples, score

    p = argparse.ArgumentParser(prog="python -m benchmarks.compiled_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="assets/models/tiny-mars-b4")
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--taus", type=list_arg(float), default=(1.0, 0.95))
    p.add_argument("--batch-sizes", type=list_arg(int, minimum=1), default=(16,))
    p.add_argument("--mode", default="mars", choices=("mars", "ar"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA, compile=True runs CUDA graphs)")
    a = p.parse_args(argv)
    if a.n < 1 or a.max_new_tokens < 1 or a.threads < 1:
        p.error("--n, --max-new-tokens and --threads must be >= 1")
    torch.set_num_threads(a.threads)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    model, tok = load_model(a.model, device=a.device)
    B = trained_block_size(a.model) or 4
    examples = make_examples(a.n, 0, "eval")
    ids = [encode_prompt(tok, ex["messages"][0]["content"]) for ex in examples]
    acc = lambda out: sum(score(t, ex["answer"]) for t, ex in  # noqa: E731
                          zip(tok.batch_decode(out, skip_special_tokens=True), examples)) / len(out)
    print(f"{a.n} held-out problems (make_examples({a.n}, 0, 'eval')), greedy, max_new_tokens {a.max_new_tokens}, "
          f"{a.model}, mode {a.mode}, B = {B}, cursor cache\n")
    print("| tau | batch | compiled = eager | accuracy eager / compiled | T/F | graphs built | eager s | compiled s |\n"
          "|---:|---:|---:|---|---:|---:|---:|---:|")
    for tau in a.taus:
        for batch in a.batch_sizes:
            base = dict(mode=a.mode, tau=tau, block_size=B, cache="cursor", max_new_tokens=a.max_new_tokens)
            eager, tf, te = decode(model, tok, ids, DecodeConfig(**base), batch)
            g0 = counters["stats"]["unique_graphs"]
            comp, tf_c, tc = decode(model, tok, ids, DecodeConfig(**base, compile=True), batch)
            same = sum(x == y for x, y in zip(eager, comp))
            print(f"| {tau:g} | {batch} | {100 * same / len(ids):.1f}% ({same} of {len(ids)}) | "
                  f"{100 * acc(eager):.1f}% / {100 * acc(comp):.1f}% | {tf:.2f} / {tf_c:.2f} | "
                  f"{counters['stats']['unique_graphs'] - g0} | {te:.0f} | {tc:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
