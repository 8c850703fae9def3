"""Exact tokens per forward of every lossless configuration on a model's known AR outputs, no decoding.

    python -m benchmarks.mask_replay --run runs/si48-base --self-instruct user_oriented_instructions.jsonl \
        --model smollm2-135m-instruct --layers runs/gated-a/snapshots/step000400.pt --out runs/replay/400.json

A lossless decode's output is the model's greedy AR output (a `benchmarks.real_eval` run's `ar`
records) and its drafts depend only on that text and the masks' predictions after each prefix of
it, so one forward per prompt (`mars_core.fastest.sample_of`: a group of masks after every
position) and the decoders' own planner (`fastest.replay`) give the forwards of every
configuration exactly: the chain ("last", "all"), a draft tree, planned budgets, with and without
prompt lookup. For a mask-gated fine-tune the AR output is the base's whatever the snapshot, so
one AR run serves every snapshot of a training curve. Also reported: the masks' top-1 accuracy per
distance (the share of positions whose mask predicts the AR token).

`--distill FILE --split dev|train` replays the base's answers of a `training.distill` file instead of
a run: its held-out prompts or those it trains on, which with a self-instruct replay splits the
masks' gap on real text into what they memorised and what our prompt generator does not cover.
Where the answers come from several categories (Spec-Bench) the result also holds each category's
own replay ("by category"); `--per-category N` replays the first N answers of each.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
from tqdm.auto import tqdm

from mars_core import DecodeConfig, load_model
from mars_core.fastest import replay, sample_of
from mars_core.gate import install_gate
from mars_core.prompts import special_ids

from .real_eval import first_of_each, read_set
from .tree_bound import ar_text

CONFIGS = {
    "chain last": dict(draft_groups="last"), "chain all": dict(draft_groups="all"),
    "tree 2,2,1": dict(draft_tree=(2, 2, 1)), "budget 8,2": dict(draft_budget=(8, 2)),
    "budget 12,3": dict(draft_budget=(12, 3)),
    "chain last + lookup": dict(draft_groups="last", prompt_lookup=2, prompt_lookup_tokens=10),
    "chain all + lookup": dict(draft_groups="all", prompt_lookup=2, prompt_lookup_tokens=10),
    "tree 2,2,1 + lookup": dict(draft_tree=(2, 2, 1), prompt_lookup=2, prompt_lookup_tokens=10),
    "budget 8,2 + lookup": dict(draft_budget=(8, 2), prompt_lookup=2, prompt_lookup_tokens=10),
}


def distill_texts(path: str, split: str, limit: int | None, max_new_tokens: int, stop_id: int):
    """(texts, tokens) as `ar_text` gives them for the answers of a distill file (the base's greedy
    output, stored as generated): `split` "dev" keeps the held-out prompts (every 20th id, the rule of
    training.frozen_stage.holdout), "train" the others; each answer cut at `max_new_tokens`, its stop
    token put back where a decode capped there would have emitted it."""
    texts, tokens = [], []
    with open(path, encoding="utf-8") as f:
        for r in map(json.loads, filter(str.strip, f)):
            if (r["id"] % 20 == 0) != (split == "dev") or not r["response_ids"]:
                continue
            ids = r["response_ids"][:max_new_tokens]
            ended = r["ended"] and len(r["response_ids"]) < max_new_tokens  # at the cap AR stops without it
            texts.append((r["prompt_ids"] + ids + ([stop_id] if ended else []), len(r["prompt_ids"]) - 1))
            tokens.append(len(ids))
            if len(texts) == limit:
                break
    return texts, tokens


def samples_of(model, texts: list, mask_id: int, block_size: int) -> list:
    """One forward per text, with progress on stderr (Spec-Bench's 480 take over an hour on 2 cores)."""
    return [sample_of(model, text, first, mask_id, block_size)
            for text, first in tqdm(texts, desc="forwards", unit="text", mininterval=10)]


def summarise(samples, tokens: list[int], block_size: int) -> dict:
    """Tokens per forward of each config (tokens as real_eval counts them: EOS excluded, the forward
    that emits it counted) and the masks' predictions per distance (`by_distance`)."""
    out = {}
    for name, kw in tqdm(CONFIGS.items(), desc="replays", unit="config", mininterval=10):
        cfg = DecodeConfig(mode="lossless", block_size=block_size, **kw)
        forwards = sum(len(replay(s, cfg)) for s in samples)
        out[name] = round(sum(tokens) / forwards, 4)
    out.update(by_distance(samples, block_size))
    return out


def by_distance(samples, block_size: int) -> dict:
    """Per distance 2..B: the share of masks whose top-1 is the AR token ("top1"), and, where the token
    before the target differs from it, the share whose top-1 is that previous token ("says previous":
    the repeat a confident wrong mask writes at tau, "at sea sea")."""
    hits = [[0, 0] for _ in range(block_size - 1)]
    says_prev = [[0, 0] for _ in range(block_size - 1)]
    for s in samples:  # row t - first: the masks after text[:t + 1], mask m predicts text[t + 2 + m]
        for row, t in enumerate(range(s.first, len(s.text))):
            for m in range(block_size - 1):
                if t + 2 + m < len(s.text):
                    top, want, before = s.ids[row][m][0], s.text[t + 2 + m], s.text[t + 1 + m]
                    hits[m][0] += top == want
                    hits[m][1] += 1
                    if before != want:
                        says_prev[m][0] += top == before
                        says_prev[m][1] += 1
    return {"top1 by distance": _shares(hits), "says previous by distance": _shares(says_prev)}


def _shares(counts: list[list[int]]) -> list[float | None]:
    return [round(h / n, 4) if n else None for h, n in counts]


def by_category(samples, tokens: list[int], categories: list[str], block_size: int) -> dict:
    """`summarise` of each category's texts alone: where on real text the masks fall short."""
    out = {}
    for cat in dict.fromkeys(categories):
        idx = [i for i, c in enumerate(categories) if c == cat]
        out[cat] = {"n": len(idx), **summarise([samples[i] for i in idx], [tokens[i] for i in idx], block_size)}
    return out


CURVE = ("chain last", "chain all", "tree 2,2,1", "budget 12,3", "chain all + lookup", "tree 2,2,1 + lookup")


def curve(args, model, tok, texts: list, tokens: list[int], mask_id: int) -> int:
    """Every `--every`-th snapshot of a gated run (and its last), replayed; RUN/curve/curve.json."""
    from mars_core.gate import gate_of, load_gate_state

    names = sorted(f for f in os.listdir(os.path.join(args.curve, "snapshots")) if f.endswith(".pt"))
    picked = names[args.every - 1::args.every] + ([names[-1]] if names and names[-1] not in names[args.every - 1::args.every] else [])
    folder = os.path.join(args.curve, "curve")
    os.makedirs(folder, exist_ok=True)
    points = []
    for name in picked:
        saved = torch.load(os.path.join(args.curve, "snapshots", name), map_location="cpu")
        path = os.path.join(folder, name.replace(".pt", ".json"))
        if not os.path.isfile(path):
            if gate_of(model) is None:
                install_gate(model, saved["gate"], mask_id)
            else:
                load_gate_state(model, saved["gate"])
            samples = samples_of(model, texts, mask_id, args.block_size)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(summarise(samples, tokens, args.block_size), f)
        with open(path, encoding="utf-8") as f:
            got = json.load(f)
        points.append({"snapshot": f"step {saved['state']['step']}", "minutes": round(saved["state"]["cpu_minutes"], 1),
                       "cpu": True, **{k: got[k] for k in CURVE}})
        print(points[-1], flush=True)
    with open(os.path.join(folder, "curve.json"), "w", encoding="utf-8") as f:
        json.dump(points, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default=None, help="a real_eval folder holding the model's `ar` outputs")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec-bench")
    src.add_argument("--self-instruct")
    src.add_argument("--prompts")
    src.add_argument("--distill", help="a training.distill file: replay its answers (no --run)")
    p.add_argument("--split", choices=("dev", "train"), default="dev", help="with --distill: held-out or trained-on prompts")
    p.add_argument("--max-new-tokens", type=int, default=128, help="with --distill: answers cut at this length")
    p.add_argument("--model", default="smollm2-135m-mars")
    p.add_argument("--layers", default=None, help="a gated stage's snapshot: its adapters on --model")
    p.add_argument("--curve", default=None, help="a gated run's folder: replay each of its snapshots (kept in "
                   "RUN/curve/, resumable) and write RUN/curve/curve.json against CPU-minutes; --out is then unused")
    p.add_argument("--every", type=int, default=1, help="with --curve: every N-th snapshot (and the last)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--per-category", type=int, default=None, help="with --run: the first N answers of each category")
    p.add_argument("--out", default=None)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    kind, path = next((k, v) for k, v in (("spec-bench", args.spec_bench), ("self-instruct", args.self_instruct),
                                          ("ours", args.prompts), ("distill", args.distill)) if v)
    if not (args.out or args.curve):
        p.error("give --out (one replay) or --curve RUN (a training curve)")
    if (kind == "distill") == bool(args.run):
        p.error("give --run with a prompt file, or --distill without it")
    try:
        model, tok = load_model(args.model, dtype="float32")
        if args.layers:
            install_gate(model, torch.load(args.layers, map_location="cpu")["gate"], tok.mask_token_id)
        mask_id, _, stop = special_ids(model, tok)
        if kind == "distill":
            texts, tokens = distill_texts(path, args.split, args.limit, args.max_new_tokens, stop[0])
            categories = [kind] * len(texts)
        else:
            prompts = {r["id"]: r for r in read_set(kind, path)}
            with open(os.path.join(args.run, "outputs.jsonl"), encoding="utf-8") as f:
                ars = first_of_each([r for r in map(json.loads, filter(str.strip, f)) if r["setting"] == "ar"],
                                    args.per_category)[: args.limit]
            texts, tokens = [ar_text(tok, prompts, r, stop[0]) for r in ars], [r["tokens"] for r in ars]
            categories = [r.get("category", kind) for r in ars]
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {e}")
        return 2
    if not texts:
        print(f"error: {path} has no answers to replay")
        return 2
    if args.curve:
        return curve(args, model, tok, texts, tokens, mask_id)
    samples = samples_of(model, texts, mask_id, args.block_size)
    result = {"model": args.model, "layers": args.layers, "n": len(samples), **({"split": args.split} if kind == "distill" else {}),
              **summarise(samples, tokens, args.block_size)}
    if len(set(categories)) > 1:
        result["by category"] = by_category(samples, tokens, categories, args.block_size)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
