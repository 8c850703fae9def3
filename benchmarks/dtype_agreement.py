"""How often greedy decoders agree, token for token, in a dtype: what "identical to AR" can mean there.

    python -m benchmarks.dtype_agreement --model smollm2-135m-instruct --dtype bfloat16 \
        --self-instruct user_oriented_instructions.jsonl --offset 100 --n 20 --out runs/agree-bf16

Every decoder below is greedy and, in exact arithmetic, emits the same tokens: HF `generate`
(dynamic cache, batch 1), our AR (cursor cache, batch 1 and batch 4), lossless MARS (the chain)
and the exact configuration `--exact` names (default: lossless with a (8, 2) budget and prompt
lookup). In fp32 they agree on every prompt (the tests check it on random models). In bf16 the
result of a forward depends on the kernel's shape (how many tokens, which columns are read, the
batch): a near-tie in the argmax can flip between a 1-token forward and a 14-token one. The table
gives, for each pair, the share of prompts with identical outputs and the mean position of the
first difference among those that differ: the AR variants against each other say what any
"identical to AR" claim in bf16 is worth.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from mars_core import DecodeConfig, load_model
from mars_core.generate import decode_steps
from mars_core.prompts import encode_prompt, special_ids

from .real_eval import first_difference, read_set


def hf_greedy(model, tok, ids: list[int], max_new: int) -> list[int]:
    _, pad, stop = special_ids(model, tok)
    x = torch.tensor([ids])
    gen = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=pad, eos_token_id=stop)[0, x.shape[1]:].tolist()
    return gen[:next((j for j, t in enumerate(gen) if t in stop), len(gen))]


def ours(model, tok, ids: list[list[int]], cfg: DecodeConfig) -> list[list[int]]:
    rows, steps = decode_steps(model, tok, ids, cfg)
    for _ in steps:
        pass
    return rows.out


def decoders(max_new: int, exact: DecodeConfig) -> dict:
    ar = DecodeConfig(mode="ar", cache="cursor", max_new_tokens=max_new)
    chain = DecodeConfig(mode="lossless", max_new_tokens=max_new)
    return {"hf-generate": None, "ar b1": (ar, 1), "ar b4": (ar, 4), "lossless chain": (chain, 1),
            "exact config": (DecodeConfig(**{**exact.__dict__, "max_new_tokens": max_new}), 1)}


def agreement(outputs: dict[str, list[list[int]]]) -> list[dict]:
    rows = []
    for a, b in itertools.combinations(outputs, 2):
        diffs = [first_difference(x, y) for x, y in zip(outputs[a], outputs[b])]
        differing = [d for d in diffs if d is not None]
        rows.append({"a": a, "b": b, "identical": 1 - len(differing) / len(diffs),
                     "first_difference": sum(differing) / len(differing) if differing else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--self-instruct", required=True)
    p.add_argument("--offset", type=int, default=100, help="skip the first prompts (the evaluation set's)")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--exact", default="8,2", help="the exact row's draft_budget nodes,groups")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prompts = read_set("self-instruct", args.self_instruct)[args.offset:args.offset + args.n]
        model, tok = load_model(args.model, dtype=getattr(torch, args.dtype))
        budget = tuple(int(x) for x in args.exact.split(","))
        exact = DecodeConfig(mode="lossless", draft_budget=budget, prompt_lookup=2, prompt_lookup_tokens=10)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    ids = [encode_prompt(tok, r["prompt"]) for r in prompts]
    outputs = {}
    with torch.inference_mode():
        for name, spec in decoders(args.max_new_tokens, exact).items():
            if spec is None:
                outputs[name] = [hf_greedy(model, tok, x, args.max_new_tokens) for x in ids]
                continue
            cfg, batch = spec
            outputs[name] = [o for i in range(0, len(ids), batch) for o in ours(model, tok, ids[i:i + batch], cfg)]
            print(f"{name}: done", flush=True)
    rows = agreement(outputs)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "agreement.json"), "w", encoding="utf-8") as f:
        json.dump({"model": args.model, "dtype": args.dtype, "n": len(ids), "max_new_tokens": args.max_new_tokens,
                   "pairs": rows, "outputs": outputs}, f)
    print(f"| {args.dtype}, {len(ids)} prompts | identical | first difference |\n|---|---:|---:|")
    for r in rows:
        fd = "-" if r["first_difference"] is None else f"{r['first_difference']:.1f}"
        print(f"| {r['a']} vs {r['b']} | {r['identical']:.0%} | {fd} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
