"""Lossless MARS: which mask-group layout pays? Tokens per forward and forward cost, measured.

    python -m benchmarks.lossless_layouts --n 100 --batch-sizes 1,16

A lossless step forwards [new real tokens | k drafts | mask groups]. Layouts compared:

  all    one group of B - 1 masks after every possible accept count j = 0..k (the default):
         new drafts whatever j is; width n + k + (k + 1)(B - 1)
  last   one group, after d_k: new drafts only when every draft was accepted, otherwise the
         next step has no drafts (it emits one token); width n + k + (B - 1)
  ends   groups after j = 0 and j = k (full rejection and full acceptance); width
         n + k + 2(B - 1)

The output is AR's under every layout (only the drafts differ), so each layout is run for real
(greedy, cursor cache, the bundled MARS model): it gives the exact number of forwards and the
width of each one. The cost of a forward of each width is measured with
`benchmarks.ceiling.forward_costs` at the same batch size, and a layout's forward time is the
sum over its forwards. The layout with the least forward time per token wins.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from mars_core.config import DecodeConfig, TauControl
from mars_core.decode_exact import SelfDrafter, decode_exact
from mars_core.decoding import Rows
from mars_core.loading import load_model
from mars_core.prompts import encode_prompt, special_ids

from .ceiling import forward_costs

LAYOUTS = ("all", "last", "ends")


class LayoutDrafter(SelfDrafter):
    """The default drafter, keeping a group's drafts only when `layout` would have that group."""

    def __init__(self, n_rows: int, layout: str, B: int):
        super().__init__(n_rows)
        self.layout, self.G = layout, B - 1
        self.widths: list[int] = []  # per forward: the widest row's window under this layout
        self.feed_len = [0] * n_rows

    def width(self, n: int, k: int) -> int:
        groups = {"all": k + 1, "last": 1, "ends": 1 if k == 0 else 2}[self.layout]
        return n + k + groups * self.G

    def propose(self):
        self.widths.append(max(self.width(n, len(d)) for n, d in zip(self.feed_len, self.drafts)))
        return super().propose()

    def update(self, j, emitted, drafts, q):
        had = [len(d) for d in self.drafts]
        keep_group = {"all": lambda a, k: True, "last": lambda a, k: a == k, "ends": lambda a, k: a in (0, k)}[self.layout]
        drafts = [d if keep_group(a, k) else [] for d, a, k in zip(drafts, j, had)]
        self.feed_len = [len(e) - a for e, a in zip(emitted, j)]
        super().update(j, emitted, drafts, q)

    def select(self, keep):
        super().select(keep)
        self.feed_len = [self.feed_len[i] for i in keep]


def run(model, tok, prompts: list[list[int]], layout: str, B: int, batch: int, max_new: int):
    mask_id, pad_id, stop = special_ids(model, tok)
    cfg = DecodeConfig(mode="lossless", block_size=B, cache="cursor", max_new_tokens=max_new)
    out, widths, tokens, forwards = [], [], 0, 0
    for i in range(0, len(prompts), batch):
        rows = Rows(prompts[i:i + batch], cfg, TauControl(1.0), stop, "cpu")
        drafter = LayoutDrafter(len(rows.prompts), layout, B)
        drafter.feed_len = [len(p) for p in rows.prompts]
        for _ in decode_exact(model, rows, mask_id, pad_id, drafter=drafter):
            pass
        out += rows.out
        widths += drafter.widths
        tokens += rows.stats.tokens
        forwards += rows.stats.row_forwards
    return out, widths, tokens, forwards


def main(argv=None) -> int:
    from tasks.synthetic import make_examples

    p = argparse.ArgumentParser(prog="python -m benchmarks.lossless_layouts", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="assets/models/tiny-mars-b4")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    prompts = [encode_prompt(tok, ex["messages"][0]["content"]) for ex in make_examples(args.n, 0, "eval")]
    context = int(statistics.mean(len(x) for x in prompts)) + args.max_new_tokens // 4
    print(f"| batch | layout | T/F | mean width | forward ms / token | vs all |\n|---:|---|---:|---:|---:|---:|")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        results, ref = {}, None
        for layout in LAYOUTS:
            out, widths, tokens, forwards = run(model, tok, prompts, layout, args.block_size, batch, args.max_new_tokens)
            ref = ref or out
            assert out == ref, "a layout changed the output: lossless is broken"
            results[layout] = (widths[1:], tokens, forwards)  # the first forward (the prompt) is common
        ks = sorted({w for ws, _, _ in results.values() for w in ws})
        cost = forward_costs(model, batch, context, ks, args.repeats)
        base = None
        for layout, (widths, tokens, forwards) in results.items():
            per_token = sum(cost[w] for w in widths) / tokens * 1e3
            base = base or per_token
            print(f"| {batch} | {layout} | {tokens / forwards:.2f} | {statistics.mean(widths):.1f} | "
                  f"{per_token:.3f} | {base / per_token:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
