"""The MARS stage for a real model on a CPU: the top decoder layers train, the rest are frozen.

Examples come from `training.distill` (prompt ids + the model's own greedy answer). Each example's
lower-layer output is computed once and kept (memory and `OUT/lower/`), so later epochs run only
the trained layers (`training.frozen_layers`). The run stops after `--minutes` (a stage of the
build) and saves a snapshot of the trained layers every `--snapshot-minutes`; run the same command
again to resume from the last snapshot, with the optimizer and the data order where they were.
`--init OTHER/latest.pt` starts instead from another run's trained layers (same `--train-layers`)
with a fresh optimizer and schedule: a run continued on more data; `--init FOLDER/delta.safetensors`
starts from the model as it ships (the base plus that delta, dequantised as `load_model` adds it).
`--lora-rank R` trains low-rank adapters on those layers instead of the layers themselves
(`training.lora`): a continuation whose increment the repository can carry in a few MB, shipped as
`lora.safetensors` on top of a delta, so it must start from that delta (`--init` of a `.safetensors`):
trained on the fp32 layers the delta rounds, it would ship on weights it never saw.

    python -m training.frozen_stage --data data/smollm2/distill.jsonl --out runs/smollm2-mars \
        --train-layers 6 --lr 1e-4 --minutes 60
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

from mars_core import load_model
from mars_core.packaged import sha256_of
from training.checkpoint import hold_folder, write_json
from training.frozen_layers import trainable_upper, upper_loss
from training.lora import add_lora, adapter_state, load_adapter_state, merged_layers
from training.lower_cache import LowerCache
from training.schedule import batch_at, lr_at, steps_per_epoch, total_steps


def holdout(record_id: int) -> bool:
    """Every 20th prompt id is kept out of training: the dev set the curve is measured on."""
    return record_id % 20 == 0


def read_examples(paths: str | list[str], eos_id: int, max_len: int, first: int | None = None) -> list[tuple[int, list[int], int]]:
    """(id, ids, response start) of the training records among the `first` lines of the files read in
    order (all when None; distill files only grow, so a prefix of the files' concatenation is a fixed
    data set while every file but the last is complete), cut at `max_len` tokens."""
    lines, seen = [], set()
    for path in [paths] if isinstance(paths, str) else paths:
        with open(path, encoding="utf-8") as f:
            lines += [line for line in f if line.strip()]
    out = []
    for line in lines[:first]:
        rec = json.loads(line)
        if rec["id"] in seen:  # two files from one prompt set would count an answer twice
            raise ValueError(f"prompt id {rec['id']} is in the training data twice: give files of distinct ids")
        seen.add(rec["id"])
        if holdout(rec["id"]) or not rec["response_ids"]:
            continue
        ids = rec["prompt_ids"] + rec["response_ids"] + ([eos_id] if rec["ended"] else [])
        start = len(rec["prompt_ids"])
        if start + 1 < max_len:
            out.append((rec["id"], ids[:max_len], start))
    return out


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


def start_from(model, split: int, path: str, base: str, lora: bool) -> float:
    """Load another run's trained layers (its latest.pt or a snapshot) or a shipped delta as this run's
    start, with a fresh optimizer and schedule. Returns the training minutes behind it, which this
    run's clock continues, so a curve against minutes counts all the CPU time since the base."""
    if not os.path.isfile(path):
        raise ValueError(f"--init {path}: no such file (give a run's latest.pt, one of its snapshots or a delta.safetensors)")
    if path.endswith(".safetensors"):
        return _start_from_delta(model, split, path, base)
    if lora:
        raise ValueError(f"--init {path}: a LoRA continuation ships as lora.safetensors on top of a delta.safetensors, so it "
                         "trains on the weights that delta gives, not on a run's fp32 layers: write the delta "
                         f"(python -m training.delta {path} FOLDER) and give --init FOLDER/delta.safetensors")
    saved = torch.load(path)
    if set(saved["layers"]) != set(_upper_layers(model, split)):
        first = min(_layer_index(k) for k in saved["layers"])
        raise ValueError(f"--init {path} trained layers {first}.. of the model; this run trains {split}.. "
                         "(give the same --train-layers)")
    model.load_state_dict(saved["layers"], strict=False)
    return float(saved["state"]["minutes"])


def _start_from_delta(model, split: int, path: str, base: str) -> float:
    """Add a `training.delta` file to the base as `mars_core.packaged.ensure_derived` does (fp32
    base + the dequantised delta): the run starts from the shipped weights, bit for bit."""
    from safetensors import safe_open

    from mars_core.packaged import delta_tensors

    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        stored = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("format", "").startswith("lora"):
        raise ValueError(f"--init {path} holds adapters, which ship beside a delta: give the delta.safetensors instead")
    if meta.get("base") and not _same_model(meta["base"], base):
        raise ValueError(f"--init {path} is a delta on {meta['base']}; this run's --base is {base}")
    params = model.state_dict()
    deltas = delta_tensors(stored, os.path.basename(path))
    outside = sorted(set(deltas) - set(_upper_layers(model, split)))
    if outside:
        raise ValueError(f"--init {path} changes {outside[0]} (and {len(outside) - 1} more) outside the layers this run "
                         f"trains ({split}..): give the --train-layers of the run it came from")
    with torch.no_grad():
        for key, d in deltas.items():
            if params[key].shape != d.shape:
                raise ValueError(f"--init {path}: {key} is {tuple(d.shape)}, the base's {tuple(params[key].shape)}")
            params[key].copy_(params[key] + d)
    return float(meta.get("minutes", 0.0))


def _same_model(a: str, b: str) -> bool:
    return a == b or (os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))


# options a resumed run may change: when and how often it stops and saves, where its files are
RESUME_FREE = {"minutes", "max_steps", "snapshot_minutes", "threads", "data", "out", "lower", "build_cache"}


def check_resume(latest: str, saved_state: dict, args: dict, examples: int, total: int) -> None:
    """A resumed run must be the same run: the options that change what is trained, its examples and
    its schedule (a run saved before the last batch of an epoch could be short planned fewer steps
    where accum does not divide the examples: resumed, its learning rate would jump)."""
    saved_args = saved_state.get("args", {})
    changed = [k for k, v in args.items() if k not in RESUME_FREE and saved_args.get(k, v) != v]
    if changed:
        shown = ", ".join(f"--{k.replace('_', '-')} {saved_args[k]} (now {args[k]})" for k in changed)
        raise ValueError(f"{latest} is a run with other settings: {shown}; use those, or another --out")
    if saved_state.get("examples", examples) != examples:
        raise ValueError(f"{latest} trained on {saved_state['examples']} examples, --data and --first now give {examples}")
    # before "total_steps" was saved, the plan assumed a full batch every step
    planned = saved_state.get("total_steps", math.ceil(args["epochs"] * examples / args["accum"]))
    if planned != total:
        raise ValueError(f"{latest} was saved by the old schedule, which planned {planned} steps where this version plans "
                         f"{total} (every epoch's last batch runs, short when --accum does not divide the {examples} "
                         "examples): resumed, its learning rate would jump. Start another --out (--init "
                         f"{latest} continues its layers), or finish it with the version that started it")


POSITIVE = ("accum", "block_size", "epochs", "max_len", "lora_rank", "lora_alpha", "max_distance", "train_layers")


def check_options(args) -> None:
    """Values no run can use are refused before anything loads."""
    for key in POSITIVE:
        value = getattr(args, key)
        if value is not None and value <= 0:
            raise ValueError(f"--{key.replace('_', '-')} must be positive, got {value}")
    for key in ("lr", "warmup", "ar_weight"):
        if getattr(args, key) < 0:
            raise ValueError(f"--{key.replace('_', '-')} must be >= 0, got {getattr(args, key)}")
    if args.lora_alpha is not None and args.lora_rank is None:
        raise ValueError("--lora-alpha scales LoRA adapters: give --lora-rank too (or leave --lora-alpha out)")


def train(args) -> None:
    lock = hold_folder(args.out)  # noqa: F841 (held until train returns)
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.base, dtype="float32")
    if args.train_layers > model.config.num_hidden_layers:
        layers = model.config.num_hidden_layers
        raise ValueError(f"--train-layers {args.train_layers}: {args.base} has {layers} layers (allowed: 1..{layers})")
    split = model.config.num_hidden_layers - args.train_layers
    examples = read_examples(args.data, tokenizer.eos_token_id, args.max_len, args.first)
    if not examples:
        raise ValueError(f"{args.data} has no training records (held-out ids and empty answers are skipped)")
    params, optimizer, state = start_or_resume(args, model, split, len(examples))
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "args.json"), vars(args))
    cache = LowerCache(model, split, args.block_size, tokenizer.mask_token_id, args.lower or os.path.join(args.out, "lower"))
    if args.build_cache:
        build_cache(cache, examples)
        return
    run_steps(args, model, split, params, optimizer, cache, examples, state)


def start_or_resume(args, model, split: int, n: int):
    """(trained parameters, optimizer, loop state): fresh, from --init, or where OUT/latest.pt stopped."""
    lora = args.lora_rank is not None
    total = total_steps(args.epochs, n, args.accum)
    state = {"step": 0, "seen": 0, "minutes": 0.0, "epoch": 0, "args": vars(args), "examples": n, "total_steps": total}
    latest = os.path.join(args.out, "latest.pt")
    saved = torch.load(latest) if os.path.isfile(latest) else None
    if saved is not None and lora != ("lora" in saved):
        raise ValueError(f"{latest} was {'' if 'lora' in saved else 'not '}trained with LoRA; resume it with the same --lora-rank")
    if saved is not None:
        check_resume(latest, saved["state"], vars(args), n, total)
    if args.init and (saved is None or lora):
        # a LoRA run keeps its start weights frozen under the adapters, so a resume loads them again
        state["minutes"] = start_from(model, split, args.init, args.base, lora)
        state["init_sha256"] = sha256_of(args.init) if args.init.endswith(".safetensors") else None
        if saved is not None and saved["state"].get("init_sha256", state["init_sha256"]) != state["init_sha256"]:
            raise ValueError(f"--init {args.init} changed since {latest} started on it: its adapters would resume on "
                             "other weights; give the file it started from, or another --out")
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
    return params, optimizer, state


def build_cache(cache: LowerCache, examples) -> None:
    for i, ex in enumerate(examples):
        cache.get(ex)
        cache.memory.clear()
        if (i + 1) % 50 == 0:
            print(f"lower cache {i + 1}/{len(examples)}", flush=True)


def run_steps(args, model, split, params, optimizer, cache, examples, state) -> None:
    """Optimizer steps from `state["step"]` until the schedule ends or a limit of this sitting is reached."""
    total, n = state["total_steps"], len(examples)
    began, spent_before, last_snap = time.time(), state["minutes"], state["minutes"]
    with open(os.path.join(args.out, "log.jsonl"), "a", encoding="utf-8") as log:
        while state["step"] < total:
            batch = [examples[i] for i in batch_at(state["step"], n, args.accum, args.seed)]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(state["step"], total, args.lr, args.warmup)
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
            state["epoch"] = state["step"] // steps_per_epoch(n, args.accum)
            state["minutes"] = spent_before + (time.time() - began) / 60
            log.write(json.dumps({"step": state["step"], "minutes": round(state["minutes"], 2), "noisy": round(sums[0], 4),
                                  "clean": round(sums[1], 4), "lr": optimizer.param_groups[0]["lr"]}) + "\n")
            log.flush()
            done = (state["step"] >= total or state["minutes"] - spent_before >= args.minutes
                    or (args.max_steps is not None and state["step"] >= args.max_steps))
            if done or state["minutes"] - last_snap >= args.snapshot_minutes:
                save_snapshot(args.out, model, split, optimizer, state, args.lora_rank is not None)
                last_snap = state["minutes"]
                print(f"step {state['step']}/{total} {state['minutes']:.1f} min noisy {sums[0]:.3f} "
                      f"clean {sums[1]:.3f}", flush=True)
            if done:
                break


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--init", default=None,
                   help="start from another run's trained layers (a latest.pt or snapshot) or from the model a "
                        "delta.safetensors ships (LoRA: only this), fresh optimizer and schedule; "
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
        check_options(args)
        train(args)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
