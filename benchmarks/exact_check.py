"""Exactness and accuracy of lossless MARS and speculative decoding on held-out problems.

    python -m benchmarks.exact_check --n 500

Decodes `tasks.synthetic.make_examples(n, 0, "eval")` greedily with the MARS model as an AR
model (`model.generate`, the reference), then with every exact mode, cache and batch size
asked for, and prints per run: the share of problems whose output equals the reference token
for token, accuracy, tokens per (target) forward and, for spec, draft acceptance. spec-mars at
tau < 1 is not exact; its accuracy is the figure to compare with the reference's.
"""
from __future__ import annotations

import argparse
import sys

import torch

from mars_core.config import DecodeConfig
from mars_core.generate import decode_steps
from mars_core.lists import list_arg
from mars_core.loading import load_model
from mars_core.prompts import encode_prompt, special_ids


B = 4
# key -> (row label, DecodeConfig fields, uses the draft model)
RUNS = {"lossless": ("lossless", dict(mode="lossless", block_size=B), False),
        "lossless-all": ("lossless, groups all", dict(mode="lossless", block_size=B, draft_groups="all"), False),
        "lossless-compiled": ("lossless, compiled", dict(mode="lossless", block_size=B, compile=True), False),
        "spec": ("spec K=", dict(mode="spec", block_size=1), True),
        "spec-mars-1": ("spec-mars K= tau 1", dict(mode="spec", block_size=B, tau=1.0), True),
        "spec-mars-0.95": ("spec-mars K= tau 0.95", dict(mode="spec", block_size=B, tau=0.95), True),
        "mars-0.95": ("mars tau 0.95 (not exact)", dict(mode="mars", block_size=B, tau=0.95), False)}


def hf_reference(model, tok, ids: list[list[int]], max_new: int, batch: int) -> list[list[int]]:
    from mars_core.decoding import left_pad

    _, pad, stop = special_ids(model, tok)
    out = []
    for i in range(0, len(ids), batch):
        x, valid = left_pad(ids[i:i + batch], pad, "cpu")
        gen = model.generate(x, attention_mask=valid.long(), do_sample=False, max_new_tokens=max_new,
                             pad_token_id=pad, eos_token_id=stop)[:, x.shape[1]:].tolist()
        for row in gen:
            cut = next((j for j, t in enumerate(row) if t in stop), len(row))
            out.append(row[:cut])
    return out


def decode(model, tok, ids, cfg: DecodeConfig, batch: int, draft=None):
    out, stats = [], []
    for i in range(0, len(ids), batch):
        rows, steps = decode_steps(model, tok, ids[i:i + batch], cfg, draft_model=draft)
        for _ in steps:
            pass
        out += rows.out
        stats.append(rows.stats)
    tokens = sum(s.tokens for s in stats)
    forwards = sum(s.row_forwards for s in stats)
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted_drafts for s in stats)
    return out, tokens / forwards, (accepted / drafted if drafted else None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.exact_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="assets/models/tiny-mars-b4")
    p.add_argument("--draft-model", default="assets/models/tiny-draft")
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", type=list_arg(int, minimum=1), default=(1, 8, 32), help="comma-separated (default 1,8,32)")
    p.add_argument("--reference-n", type=int, default=None, help="problems for the slow no-cache runs (default: all)")
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=list_arg(str), default=tuple(RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    args = p.parse_args(argv)
    unknown = set(args.runs) - set(RUNS)
    if unknown:
        p.error(f"unknown runs {sorted(unknown)}; allowed: {', '.join(RUNS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    from tasks.synthetic import make_examples, score

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    draft, _ = load_model(args.draft_model)
    examples = make_examples(args.n, 0, "eval")
    ids = [encode_prompt(tok, ex["messages"][0]["content"]) for ex in examples]
    ref = hf_reference(model, tok, ids, args.max_new_tokens, 32)
    texts = lambda out: tok.batch_decode(out, skip_special_tokens=True)  # noqa: E731
    acc = lambda out: sum(score(t, ex["answer"]) for t, ex in zip(texts(out), examples[: len(out)])) / len(out)  # noqa: E731
    print(f"{args.n} held-out problems (make_examples({args.n}, 0, 'eval')), greedy, max_new_tokens "
          f"{args.max_new_tokens}; reference: model.generate of {args.model}: accuracy {100 * acc(ref):.1f}%\n")
    print("| decoding | cache | batch | = AR | accuracy | T/F | draft acceptance |\n|---|---|---:|---:|---:|---:|---:|")
    K = args.draft_tokens
    for key in args.runs:
        name, kw, uses_draft = RUNS[key]
        name = name.replace("K=", f"K={K}")
        kw = dict(kw, draft_tokens=K) if uses_draft else kw
        plans = [("cursor", b) for b in args.batch_sizes]
        if kw["mode"] != "mars" and not kw.get("compile"):  # the no-cache reference (compiled runs on cursor only)
            plans.append(("none", 8))
        for cache, batch in plans:
            n = len(ids) if cache == "cursor" or args.reference_n is None else min(args.reference_n, len(ids))
            cfg = DecodeConfig(cache=cache, max_new_tokens=args.max_new_tokens, **kw)
            out, tf, rate = decode(model, tok, ids[:n], cfg, batch, draft if uses_draft else None)
            same = sum(a == b for a, b in zip(out, ref)) / n
            print(f"| {name} | {cache} | {batch} | {100 * same:.1f}% ({n}) | {100 * acc(out):.1f}% | {tf:.2f} | "
                  f"{'-' if rate is None else f'{100 * rate:.1f}%'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
