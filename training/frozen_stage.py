"""The MARS stage for a real model on a CPU: the top decoder layers train, the rest are frozen.

Examples come from `training.distill` (prompt ids + the model's own greedy answer). Each example's
lower-layer output is computed once and kept (memory and `OUT/lower/`), so later epochs run only
the trained layers (`training.frozen_layers`). The run stops after `--minutes` (a stage of the
build) and saves a snapshot of the trained layers every `--snapshot-minutes`; run the same command
again to resume from the last snapshot, with the optimizer and the data order where they were.
`--init OTHER/latest.pt` starts instead from another run's trained layers (same `--train-layers`)
with a fresh optimizer and schedule: a run continued on more data. `--lora-rank R` trains low-rank
adapters on those layers instead of the layers themselves (`training.lora`): a continuation whose
increment the repository can carry in a few MB.

    python -m training.frozen_stage --data data/smollm2/distill.jsonl --out runs/smollm2-mars \
        --train-layers 6 --lr 1e-4 --minutes 60
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import torch

from mars_core import load_model
from training.checkpoint import write_json
from training.frozen_layers import compact_inputs, lower_hidden, trainable_upper, upper_loss
from training.lora import add_lora, adapter_state, load_adapter_state, merged_layers


def holdout(record_id: int) -> bool:
    """Every 20th prompt id is kept out of training: the dev set the curve is measured on."""
    return record_id % 20 == 0


def read_examples(path: str, eos_id: int, max_len: int, first: int | None = None) -> list[tuple[int, list[int], int]]:
    """(id, ids, response start) of the training records among the file's `first` lines (all when
    None; distill files only grow, so a prefix is a fixed data set), cut at `max_len` tokens."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    for line in lines[:first]:
        rec = json.loads(line)
        if holdout(rec["id"]) or not rec["response_ids"]:
            continue
        ids = rec["prompt_ids"] + rec["response_ids"] + ([eos_id] if rec["ended"] else [])
        start = len(rec["prompt_ids"])
        if start + 1 < max_len:
            out.append((rec["id"], ids[:max_len], start))
    return out


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


class LowerCache:
    """The frozen layers' output per example id, computed on first use, kept in memory and on disk."""

    def __init__(self, model, split: int, block_size: int, mask_id: int, folder: str):
        self.model, self.split, self.block_size, self.mask_id = model, split, block_size, mask_id
        self.folder, self.memory = folder, {}
        os.makedirs(folder, exist_ok=True)

    def get(self, example):
        rid, ids, start = example
        c = compact_inputs(ids, start, self.block_size, self.mask_id)
        if rid not in self.memory:
            path = os.path.join(self.folder, f"{rid}.pt")
            hidden = torch.load(path) if os.path.isfile(path) else None
            if hidden is None or hidden.shape[1] != c.ids.shape[1]:
                hidden = lower_hidden(self.model, c, self.split)
                torch.save(hidden, path + ".tmp")
                os.replace(path + ".tmp", path)
            self.memory[rid] = hidden
        return c, self.memory[rid]


def save_snapshot(out: str, model, split: int, optimizer, state: dict, lora: bool = False) -> None:
    """The trained layers (fp32; with LoRA merged into them, and the adapters alone under "lora"),
    the optimizer and the loop state, written atomically."""
    layers = merged_layers(model, split) if lora else _upper_layers(model, split)
    extra = {"lora": adapter_state(model)} if lora else {}
    tmp = os.path.join(out, "latest.pt.tmp")
    torch.save({"layers": layers, "optimizer": optimizer.state_dict(), "state": state, **extra}, tmp)
    os.replace(tmp, os.path.join(out, "latest.pt"))
    snap = os.path.join(out, "snapshots", f"step{state['step']:06d}.pt")
    os.makedirs(os.path.dirname(snap), exist_ok=True)
    torch.save({"layers": layers, "state": state, **extra}, snap + ".tmp")
    os.replace(snap + ".tmp", snap)


def _upper_layers(model, split: int) -> dict:
    return {k: v for k, v in model.state_dict().items() if _layer_index(k) is not None and _layer_index(k) >= split}


def _layer_index(key: str) -> int | None:
    parts = key.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else None


def start_from(model, split: int, path: str) -> float:
    """Load another run's trained layers (its latest.pt or a snapshot) as this run's start, with a fresh
    optimizer and schedule. Returns that run's training minutes, which this run's clock continues, so
    a curve against minutes counts all the CPU time since the base."""
    if not os.path.isfile(path):
        raise ValueError(f"--init {path}: no such file (give a run's latest.pt or one of its snapshots)")
    saved = torch.load(path)
    if set(saved["layers"]) != set(_upper_layers(model, split)):
        first = min(_layer_index(k) for k in saved["layers"])
        raise ValueError(f"--init {path} trained layers {first}.. of the model; this run trains {split}.. "
                         "(give the same --train-layers)")
    model.load_state_dict(saved["layers"], strict=False)
    return float(saved["state"]["minutes"])


def train(args) -> None:
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.base, dtype="float32")
    split = model.config.num_hidden_layers - args.train_layers
    examples = read_examples(args.data, tokenizer.eos_token_id, args.max_len, args.first)
    if not examples:
        raise ValueError(f"{args.data} has no training records (held-out ids and empty answers are skipped)")
    state = {"step": 0, "seen": 0, "minutes": 0.0, "epoch": 0, "args": vars(args), "examples": len(examples)}
    latest = os.path.join(args.out, "latest.pt")
    saved = torch.load(latest) if os.path.isfile(latest) else None
    lora = args.lora_rank is not None
    if saved is not None and lora != ("lora" in saved):
        raise ValueError(f"{latest} was {'' if 'lora' in saved else 'not '}trained with LoRA; resume it with the same --lora-rank")
    if args.init and (saved is None or lora):
        # a LoRA run keeps its start weights frozen under the adapters, so a resume loads them again
        state["minutes"] = start_from(model, split, args.init)
    params = add_lora(model, split, args.lora_rank, args.lora_alpha or args.lora_rank) if lora else trainable_upper(model, split)
    model.train()
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    if saved is not None:
        if lora:
            load_adapter_state(model, saved["lora"])
        else:
            model.load_state_dict(saved["layers"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        state.update({k: saved["state"][k] for k in ("step", "seen", "minutes", "epoch")})
        print(f"resumed at step {state['step']} ({state['minutes']:.1f} min)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "args.json"), vars(args))
    cache = LowerCache(model, split, args.block_size, tokenizer.mask_token_id, args.lower or os.path.join(args.out, "lower"))
    if args.build_cache:
        for i, ex in enumerate(examples):
            cache.get(ex)
            cache.memory.clear()
            if (i + 1) % 50 == 0:
                print(f"lower cache {i + 1}/{len(examples)}", flush=True)
        return
    total_steps = math.ceil(args.epochs * len(examples) / args.accum)
    began, spent_before, last_snap = time.time(), state["minutes"], state["minutes"]
    log = open(os.path.join(args.out, "log.jsonl"), "a", encoding="utf-8")
    while state["step"] < total_steps:
        order = list(range(len(examples)))
        random.Random(args.seed + state["epoch"]).shuffle(order)
        batch = [examples[i] for i in order[state["seen"] % len(examples):][: args.accum]]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state["step"], total_steps, args.lr, args.warmup)
        sums = [0.0, 0.0]
        for ex in batch:
            c, hidden = cache.get(ex)
            noisy, clean = upper_loss(model, hidden, c, split, args.max_distance)
            ((noisy + args.ar_weight * clean) / len(batch)).backward()
            sums[0] += noisy.item() / len(batch)
            sums[1] += clean.item() / len(batch)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        state["seen"] += len(batch)
        state["epoch"] = state["seen"] // len(examples)
        state["minutes"] = spent_before + (time.time() - began) / 60
        log.write(json.dumps({"step": state["step"], "minutes": round(state["minutes"], 2), "noisy": round(sums[0], 4),
                              "clean": round(sums[1], 4), "lr": optimizer.param_groups[0]["lr"]}) + "\n")
        log.flush()
        done = (state["step"] >= total_steps or state["minutes"] - spent_before >= args.minutes
                or (args.max_steps is not None and state["step"] >= args.max_steps))
        if done or state["minutes"] - last_snap >= args.snapshot_minutes:
            save_snapshot(args.out, model, split, optimizer, state, lora)
            last_snap = state["minutes"]
            print(f"step {state['step']}/{total_steps} {state['minutes']:.1f} min noisy {sums[0]:.3f} "
                  f"clean {sums[1]:.3f}", flush=True)
        if done:
            break


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--init", default=None,
                   help="start from another run's trained layers (a latest.pt or snapshot), fresh optimizer and schedule; "
                        "a run that already has OUT/latest.pt resumes instead")
    p.add_argument("--first", type=int, default=None, help="train on the data file's first N records")
    p.add_argument("--train-layers", type=int, default=6)
    p.add_argument("--lora-rank", type=int, default=None,
                   help="train rank-R adapters on the --train-layers layers instead of the layers (default: full)")
    p.add_argument("--lora-alpha", type=float, default=None, help="adapter scale alpha / rank (default alpha = rank: scale 1)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--ar-weight", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--accum", type=int, default=8, help="examples per optimizer step")
    p.add_argument("--max-len", type=int, default=448)
    p.add_argument("--max-distance", type=int, default=None,
                   help="train only noisy targets at most this far past the last real token (block_size: those decoding reads)")
    p.add_argument("--lower", default=None, help="folder of the frozen layers' outputs (default OUT/lower; runs with the same data and layers may share one)")
    p.add_argument("--build-cache", action="store_true", help="compute the frozen layers' outputs of every example, then stop")
    p.add_argument("--minutes", type=float, default=150.0, help="stop this stage after so many minutes")
    p.add_argument("--max-steps", type=int, default=None, help="stop this stage at this optimizer step")
    p.add_argument("--snapshot-minutes", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        train(args)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
