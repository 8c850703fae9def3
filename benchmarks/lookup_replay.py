"""Which prompt-lookup setting of lossless MARS to build or run: replayed tokens per forward, and a
speed-up modelled from a measured forward-cost curve (docs/cpu-kernels.md).

    python -m benchmarks.lookup_replay --run runs/vl-si --self-instruct user_oriented_instructions.jsonl \\
        --ceiling assets/bench/ceiling-prepack/ceiling-prepacked.json

Each variant is `tree_bound.replay` of one chain (masks, or lookup drafts where a 2-gram matched)
on the run's AR outputs; a forward of width k (1 real token + its drafts + 3 masks where it
carries a group) costs c(k) / c(1) of the curve (batch 1, linear between the measured k), the
prompt's forward excluded. The model is an estimate; `benchmarks.bench` measures.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import numpy as np
import torch

from mars_core import load_model
from mars_core.prompts import special_ids

from .tree_bound import ar_text, mask_tops, replay

CHAIN = (1, 1, 1)  # block size 4: three mask drafts
VARIANTS = {  # name: (replay keywords, mask groups a forward carries); as the decoder does it since
    # 2026-12-05: with "last", a forward of copied drafts carries no group (lookup_groups=False), with
    # "all" it keeps them; the other rule of each layout is kept for the comparison
    "masks, last": (dict(groups="last"), 1),
    "masks, all": (dict(groups="all"), 4),
    "lookup 3, all": (dict(switch=2, groups="all"), 4),
    "lookup 3, all, no masks after a copied chain": (dict(switch=2, groups="all", lookup_groups=False), 4),
    "lookup 3, last": (dict(switch=2, groups="last", lookup_groups=False), 1),
    "lookup 5, last": (dict(switch=2, groups="last", lookup_tokens=5, lookup_groups=False), 1),
    "lookup 7, last": (dict(switch=2, groups="last", lookup_tokens=7, lookup_groups=False), 1),
    "lookup 10, last": (dict(switch=2, groups="last", lookup_tokens=10, lookup_groups=False), 1),
    "lookup 10, last, with masks after a copied chain": (dict(switch=2, groups="last", lookup_tokens=10), 1),
}


def cost_curve(path: str):
    """c(k) / c(1) at batch 1 from a `benchmarks.ceiling --output` ceiling.json, as a function of k."""
    with open(path, encoding="utf-8") as f:
        seconds = json.load(f)["seconds"]["1"]
    ks = sorted(int(k) for k in seconds)
    rel = [seconds[str(k)] / seconds["1"] for k in ks]
    return lambda k: float(np.interp(k, ks, rel))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.real_eval import read_set

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a real_eval folder holding the model's ar outputs")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec-bench")
    src.add_argument("--self-instruct")
    src.add_argument("--prompts", help="a file of our own {id, prompt} records")
    p.add_argument("--ceiling", required=True, help="ceiling.json of `benchmarks.ceiling --output`")
    p.add_argument("--model", default="smollm2-135m-mars")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    kind, path = next((k, v) for k, v in (("spec-bench", args.spec_bench), ("self-instruct", args.self_instruct),
                                          ("ours", args.prompts)) if v)
    try:
        cost = cost_curve(args.ceiling)
        prompts = {r["id"]: r for r in read_set(kind, path)}
        with open(os.path.join(args.run, "outputs.jsonl"), encoding="utf-8") as f:
            ar = {r["id"]: r for r in map(json.loads, filter(str.strip, f)) if r["setting"] == "ar"}
        model, tok = load_model(args.model, dtype="float32")
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {e}")
        return 2
    mask_id, _, stop_ids = special_ids(model, tok)
    forwards, costs, tokens = defaultdict(int), defaultdict(float), 0
    ids = list(ar)[: args.limit]
    for pid in ids:
        try:
            s, first = ar_text(tok, prompts, ar[pid], stop_ids[0])
        except ValueError as e:
            print(f"error: {e}")
            return 2
        with torch.inference_mode():
            tops = mask_tops(model, s, first, mask_id, len(CHAIN) + 1, 1)
        tokens += ar[pid]["tokens"]
        for name, (kw, groups) in VARIANTS.items():
            trace: list = []
            forwards[name] += replay(s, first, tops, CHAIN, trace=trace, **kw)
            costs[name] += sum(cost(1 + k + len(CHAIN) * groups * carries) for k, carries in trace[1:])
    print(f"{len(ids)} prompts, {tokens} tokens\n\n| one chain | tokens per forward | modelled speed-up |\n|---|---:|---:|")
    for name in VARIANTS:
        print(f"| {name} | {tokens / max(forwards[name], 1):.2f} | {tokens / max(costs[name], 1e-9):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
