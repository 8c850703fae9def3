"""The mask-gated MARS stage: adapters that act only at mask positions, trained on the base's answers.

The base stays the base (`mars_core.gate`): its AR output, and so lossless MARS's output, is the
base's, and tau = 1 is the base. Per example, one no-grad forward of the clean text gives every
layer's keys and values and the base's next-token distributions; then groups of masks after
chosen response positions (`training.gated_layout`) run through the gated layers with a graph,
and only they carry a loss: hard (the base's greedy answer token) or soft (KL to the base's own
distribution at the position that predicts the same token, which the clean pass gives for free).

The run is one command that resumes wherever it stopped (`OUT/latest.pt`: adapters, optimizer,
step; written atomically every `--snapshot-minutes` and at the end), on the CPU or on CUDA:

    python -m training.gated_stage --data data/smollm2/distill.jsonl --out runs/gated \
        --rank 16 --lr 1e-3 --epochs 4 --minutes 600
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from mars_core import load_model
from mars_core.gate import GATE_FILE, MATRICES, attach_gate, describe, gate_state, load_gate_state, read_gate
from training.checkpoint import hold_folder, write_json
from training.frozen_stage import lr_at, read_examples
from training.gated_layout import anchors, group_layout, with_targets
from training.schedule import batch_at, steps_per_epoch

TARGETS = ("hard", "soft", "mix")


def distance_weights(spec: str | None, block_size: int) -> torch.Tensor:
    """Weight per distance 2..B (index d), from "w2,w3,..." (default all 1)."""
    w = torch.ones(block_size + 2)
    if spec:
        values = [float(v) for v in spec.split(",")]
        if len(values) != block_size - 1 or min(values) < 0:
            raise ValueError(f"--distance-weights needs {block_size - 1} non-negative numbers (distances 2..{block_size}), got {spec!r}")
        w[2:block_size + 1] = torch.tensor(values)
    return w


def example_loss(model, ids: list[int], start: int, args, weights: torch.Tensor, gen: torch.Generator,
                 autocast) -> tuple[torch.Tensor, dict]:
    """The weighted mask loss of one example and its parts (hard CE, soft KL, per-distance top-1 hits)."""
    device = model.device
    n = len(ids)
    x = torch.tensor(ids, device=device)
    g = with_targets(group_layout(anchors(start, n, args.groups, gen), n, args.block_size, model.mars_gate.mask_id,
                                  args.max_distance, args.far_keep, gen), x.cpu())
    g = g._replace(**{k: getattr(g, k).to(device) for k in ("ids", "pos", "mask", "targets", "source", "distance")})
    gate = model.mars_gate
    with torch.no_grad(), autocast(), gate.every(False):  # the clean text: the base, no adapter runs
        clean = model.model(input_ids=x[None], use_cache=True)
        base_logp = None
        if args.targets != "hard":
            first = start - 1  # the clean rows that predict response tokens: first .. n - 2
            base_logp = F.log_softmax(model.lm_head(clean.last_hidden_state[0, first:n - 1]).float(), dim=-1)  # (r, V)
    with autocast(), gate.every(True):  # only masks: every adapter runs, no per-position select
        h = model.model(input_ids=g.ids, position_ids=g.pos, attention_mask=g.mask,
                        cache=clean.past_key_values).last_hidden_state  # (1, M, H)
        logits = model.lm_head(h[0]).float()  # (M, V)
    logq = F.log_softmax(logits, dim=-1)
    hard = -logq.gather(1, g.targets[:, None])[:, 0]  # (M,)
    w = weights.to(device)[g.distance]
    parts = {"hard": (hard * w).sum() / w.sum()}
    if base_logp is not None:
        p = base_logp[g.source - (start - 1)]  # (M, V) the base's distribution of the same token
        kl = (p.exp() * (p - logq)).sum(-1)
        parts["soft"] = (kl * w).sum() / w.sum()
    loss = {"hard": parts["hard"], "soft": parts.get("soft"),
            "mix": 0.5 * (parts["hard"] + parts.get("soft", 0))}[args.targets]
    # a mask that says the token before its target again ("at sea sea", "9 times 9 is 88") is the
    # error tau lets through; unlikelihood of that token where it is not the target itself
    prev = x[g.source]  # (M,) the token one place before each mask's target
    other = (prev != g.targets).float() * w
    if args.repeat_penalty:
        q_prev = logq.gather(1, prev[:, None])[:, 0].exp().clamp(max=1 - 1e-6)
        parts["repeat"] = (-torch.log1p(-q_prev) * other).sum() / other.sum().clamp(min=1e-6)
        loss = loss + args.repeat_penalty * parts["repeat"]
    top = logits.argmax(-1)  # (M,)
    hits = top == g.targets
    stats = {k: v.item() for k, v in parts.items()}
    stats["says_prev"] = ((top == prev).float() * other).sum().item() / max(other.sum().item(), 1e-6)
    stats.update({f"top1_d{d}": hits[g.distance == d].float().mean().item()
                  for d in range(2, args.block_size + 1) if (g.distance == d).any()})
    return loss, stats


def read_init(path: str, mask_id: int) -> dict:
    """{"gate", "state"} to start from: a gated run's latest.pt or snapshot, or a shipped model
    folder (or its gate.safetensors) on a new machine where the run's folder is gone; a folder's
    CPU-minutes come from its training_config.json."""
    folder = path if os.path.isdir(path) else None
    if folder or path.endswith(".safetensors"):
        gate_file = os.path.join(folder, GATE_FILE) if folder else path
        if not os.path.isfile(gate_file):
            raise ValueError(f"--init {path}: no {GATE_FILE} there (give a gated model folder, a run's latest.pt or a snapshot)")
        gate, stored_mask = read_gate(gate_file)
        if stored_mask != mask_id:
            raise ValueError(f"--init {path}: its gate fires on token {stored_mask}, this base's mask token is {mask_id}")
        config = os.path.join(os.path.dirname(gate_file), "training_config.json")
        saved = {}
        if os.path.isfile(config):
            with open(config, encoding="utf-8") as f:
                saved = json.load(f)
        return {"gate": {k: v.float() for k, v in gate.items()},
                "state": {"cpu_minutes": saved.get("cpu_minutes", 0.0), "minutes": saved.get("minutes", 0.0)}}
    if not os.path.isfile(path):
        raise ValueError(f"--init {path}: no such file (give a gated run's latest.pt, a snapshot or a gated model folder)")
    start = torch.load(path, map_location="cpu")
    if "gate" not in start:
        raise ValueError(f"--init {path} is not a gated stage's snapshot")
    return start


def save(out: str, model, optimizer, state: dict) -> None:
    """OUT/latest.pt (adapters, optimizer, loop state) and OUT/snapshots/stepN.pt (adapters, state), atomically."""
    gate = gate_state(model)
    tmp = os.path.join(out, "latest.pt.tmp")
    torch.save({"gate": gate, "optimizer": optimizer.state_dict(), "state": state}, tmp)
    os.replace(tmp, os.path.join(out, "latest.pt"))
    snap = os.path.join(out, "snapshots", f"step{state['step']:06d}.pt")
    os.makedirs(os.path.dirname(snap), exist_ok=True)
    torch.save({"gate": gate, "state": state}, snap + ".tmp")
    os.replace(snap + ".tmp", snap)


RESUME_FREE = {"minutes", "max_steps", "snapshot_minutes", "threads", "device", "data", "out"}


def check_resume(saved_args: dict, args: dict) -> None:
    """A resumed run must be the same run: every option that changes what is trained must match."""
    changed = [k for k, v in args.items() if k not in RESUME_FREE and saved_args.get(k, v) != v]
    if changed:
        shown = ", ".join(f"--{k.replace('_', '-')} {saved_args[k]} (now {args[k]})" for k in changed)
        raise ValueError(f"this folder holds a run with other settings: {shown}; use those, or another --out")


def train(args) -> None:
    lock = hold_folder(args.out)  # noqa: F841 (held until train returns)
    torch.manual_seed(args.seed)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # bf16 base weights where the hardware has them (the clean pass and the frozen matmuls run there),
    # fp32 adapters (the optimizer's master weights), cast at use
    model, tokenizer = load_model(args.base, dtype=getattr(torch, args.dtype), device=device)
    model.requires_grad_(False)
    matrices = tuple(m.strip() for m in args.matrices.split(",")) if args.matrices else MATRICES
    params = attach_gate(model, tokenizer.mask_token_id, args.rank, args.layers, trainable=True, dtype=torch.float32,
                         matrices=matrices)
    examples = read_examples(args.data, tokenizer.eos_token_id, args.max_len, args.first)
    if not examples:
        raise ValueError(f"{' '.join(args.data)} has no training records (held-out ids and empty answers are skipped)")
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    total = math.ceil(args.epochs * steps_per_epoch(len(examples), args.accum))
    # cpu_minutes: this process's CPU time summed over its threads, across sittings: the measure a
    # recipe is compared by ("per CPU-hour"), unmoved by pauses (SIGSTOP) and by sharing the machine
    state = {"step": 0, "minutes": 0.0, "cpu_minutes": 0.0, "examples": len(examples), "total_steps": total}
    os.makedirs(args.out, exist_ok=True)
    latest = os.path.join(args.out, "latest.pt")
    run_args = {k: v for k, v in vars(args).items()}
    if args.init and not os.path.isfile(latest):  # another run's adapters, a fresh optimizer and schedule
        start = read_init(args.init, tokenizer.mask_token_id)
        rank = describe(start["gate"])[0]
        if rank != args.rank:  # e.g. the shipped gate, cut to rank 8 after training at 16
            raise ValueError(f"--init {args.init} holds rank-{rank} adapters: give --rank {rank} to continue them")
        load_gate_state(model, {k: v.to(device) for k, v in start["gate"].items()})
        state["cpu_minutes"] = start["state"].get("cpu_minutes", 0.0)  # the clock counts all CPU since the base
        state["minutes"] = start["state"].get("minutes", 0.0)
    if os.path.isfile(latest):
        saved = torch.load(latest, map_location=device)
        check_resume(saved["state"].get("args", {}), run_args)
        if saved["state"].get("examples", len(examples)) != len(examples):  # a grown file would reshuffle every batch
            raise ValueError(f"{latest} trained on {saved['state']['examples']} examples, --data and --first now give "
                             f"{len(examples)}: give the files and --first it was started with")
        load_gate_state(model, saved["gate"])
        optimizer.load_state_dict(saved["optimizer"])
        state.update({k: saved["state"][k] for k in ("step", "minutes", "cpu_minutes")})
        print(f"resumed at step {state['step']}/{total} ({state['minutes']:.1f} min)", flush=True)
    state["args"] = run_args
    write_json(os.path.join(args.out, "args.json"), run_args)
    weights = distance_weights(args.distance_weights, args.block_size)
    autocast = contextlib.nullcontext
    model.train()
    began, spent_before = time.time(), state["minutes"]
    cpu_began, cpu_before = time.process_time(), state["cpu_minutes"]
    last_snap = state["minutes"]
    with open(os.path.join(args.out, "log.jsonl"), "a", encoding="utf-8") as log:
        while state["step"] < total:
            step = state["step"]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total, args.lr, args.warmup)
            batch = batch_at(step, len(examples), args.accum, args.seed)
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            sums: dict[str, float] = {}
            for i in batch:
                _, ids, start = examples[i]
                loss, stats = example_loss(model, ids, start, args, weights, gen, autocast)
                (loss / len(batch)).backward()
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v / len(batch)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["minutes"] = spent_before + (time.time() - began) / 60
            state["cpu_minutes"] = cpu_before + (time.process_time() - cpu_began) / 60
            log.write(json.dumps({"step": state["step"], "minutes": round(state["minutes"], 3),
                                  "cpu_minutes": round(state["cpu_minutes"], 3),
                                  "lr": optimizer.param_groups[0]["lr"], **{k: round(v, 4) for k, v in sums.items()}}) + "\n")
            log.flush()
            done = (state["step"] >= total or state["minutes"] - spent_before >= args.minutes
                    or (args.max_steps is not None and state["step"] >= args.max_steps))
            if done or state["minutes"] - last_snap >= args.snapshot_minutes:
                save(args.out, model, optimizer, state)
                last_snap = state["minutes"]
                shown = " ".join(f"{k} {v:.3f}" for k, v in sums.items())
                print(f"step {state['step']}/{total} {state['minutes']:.1f} min ({state['cpu_minutes']:.1f} CPU-min) {shown}",
                      flush=True)
            if done:
                break


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True, nargs="+",
                   help="training.distill files (the base's own answers), read in this order")
    p.add_argument("--out", required=True)
    p.add_argument("--first", type=int, default=None, help="train on the data files' first N records")
    p.add_argument("--init", default=None, help="start from another gated run's adapters, or a shipped gated model folder (fresh optimizer "
                                               "and schedule; its CPU-minutes continue); an --out with latest.pt resumes instead")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--layers", type=int, default=None, help="gate the top N decoder layers (default: all)")
    p.add_argument("--matrices", default=None,
                   help=f"the adapted matrices of each gated layer, comma-separated (default: all, {','.join(MATRICES)})")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-distance", type=int, default=None, help="train distances 2..min(B, this)")
    p.add_argument("--repeat-penalty", type=float, default=0.0,
                   help="weight of an unlikelihood term against each mask's previous token (where it is not the target)")
    p.add_argument("--far-keep", type=float, default=1.0,
                   help="keep each mask after a group's first with this chance, if the one before it was (PARD's "
                        "subsampling of far masks; 1: all)")
    p.add_argument("--groups", type=int, default=64,
                   help="groups of masks per example per visit, after random response positions (0: all)")
    p.add_argument("--targets", choices=TARGETS, default="soft",
                   help="hard: the answer's token; soft: KL to the base's distribution; mix: both, halved")
    p.add_argument("--distance-weights", default=None, help="loss weight per distance 2..B, e.g. 1,0.8,0.6")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--accum", type=int, default=8, help="examples per optimizer step")
    p.add_argument("--max-len", type=int, default=448)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the base's weights (bfloat16: GPUs and CPUs with native bf16; the adapters stay float32)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    p.add_argument("--minutes", type=float, default=60.0, help="stop this sitting after so many minutes")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--snapshot-minutes", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p


def loss_args(**overrides) -> argparse.Namespace:
    """The options `example_loss` reads, at the stage's defaults but for `overrides` (the Train tab's
    run and tests call it without a command line, so a new option reaches them by itself)."""
    args = parser().parse_args(["--data", "", "--out", ""])
    unknown = set(overrides) - set(vars(args))
    if unknown:
        raise ValueError(f"not options of the gated stage: {sorted(unknown)}")
    return argparse.Namespace(**{**vars(args), **overrides})


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.groups == 0:
        args.groups = None
    if not 0 < args.far_keep <= 1:
        print(f"error: --far-keep {args.far_keep}: give a chance above 0 and at most 1")
        return 2
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
