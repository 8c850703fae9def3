"""The training curve: tokens per forward of each snapshot of a MARS stage against training minutes.

Every `--every`-th snapshot of `RUN/snapshots/` (and the untrained base, minute 0) decodes the
same held-out prompts with `benchmarks.real_eval`; results go to `RUN/curve/` (resumable, like
real_eval) and `RUN/curve/curve.json`. A run started from another run's layers
(`frozen_stage --init`) begins with that run's points up to its start instead of the base.

    python -m benchmarks.curve runs/smollm2-mars-lr1e-4 --prompts data/smollm2/dev_prompts.jsonl 
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from benchmarks.real_eval import main as real_eval


def snapshots(run: str, every: int) -> list[str]:
    names = sorted(f for f in os.listdir(os.path.join(run, "snapshots")) if f.endswith(".pt"))
    picked = names[every - 1::every]
    if names and names[-1] not in picked:
        picked.append(names[-1])
    return [os.path.join(run, "snapshots", n) for n in picked]


def earlier_points(run: str) -> list[dict] | None:
    """A run started from another run's layers (`frozen_stage --init`) continues that run's curve:
    its points up to the start, named after it. None for a run that started from the base."""
    path = os.path.join(run, "args.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        init = json.load(f).get("init")
    if not init:
        return None
    folder = os.path.dirname(init)
    if os.path.basename(folder) == "snapshots":
        folder = os.path.dirname(folder)
    prior_curve = os.path.join(folder, "curve", "curve.json")
    if not os.path.isfile(prior_curve):
        raise ValueError(f"{run} continues {folder}, whose curve is not measured: run benchmarks.curve on {folder} first")
    start = torch.load(init)["state"]["minutes"]
    with open(prior_curve, encoding="utf-8") as f:
        prior = json.load(f)
    name = os.path.basename(os.path.normpath(folder))
    return [{**pt, "snapshot": f"{name} {pt['snapshot']}"} for pt in prior if pt["minutes"] <= start + 0.05]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run")
    p.add_argument("--prompts", required=True)
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--limit", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--taus", default="0.95")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    common = ["--model", args.base, "--prompts", args.prompts, "--limit", str(args.limit), "--taus", args.taus,
              "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size)]
    common += ["--threads", str(args.threads)] if args.threads else []
    try:
        earlier = earlier_points(args.run)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    points = earlier or []
    for snap in ([] if earlier else [None]) + snapshots(args.run, args.every):
        name = "base" if snap is None else os.path.basename(snap)[:-3]
        out = os.path.join(args.run, "curve", name)
        if real_eval(common + ["--out", out] + ([] if snap is None else ["--layers", snap])) != 0:
            return 2
        state = {} if snap is None else torch.load(snap)["state"]
        minutes = state.get("minutes", 0.0)
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        points.append({"snapshot": name, "minutes": round(minutes, 1),
                       **({"cpu_minutes": round(state["cpu_minutes"], 1)} if "cpu_minutes" in state else {}),
                       **{s: v["overall"]["tokens_per_forward"] for s, v in summary.items()},
                       **{f"{s}_identical": v["overall"]["identical"] for s, v in summary.items() if s != "ar"}})
        with open(os.path.join(args.run, "curve", "curve.json"), "w", encoding="utf-8") as f:
            json.dump(points, f, indent=1)
    for pt in points:
        print(pt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
