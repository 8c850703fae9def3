"""A short MARS stage in memory: the playground's Train tab (and the measurements behind its defaults).

The Train tab trains the bundled AR checkpoint (`assets/models/tiny-ar-sft`) on the bundled
synthetic task for a few minutes while a visitor watches. It runs the command line's code, not a
copy of it:

- the paper's objective: `training.setup.setup` (model, synthetic data, AdamW, the cosine
  schedule, accelerate) and `training.loop.Run` (the loop; its loss is `forward_loss`, i.e.
  `mars_core.mars_loss`). `LiveRun` only sends what the loop would write to disk (its log and
  checkpoints) to a callback instead, and adds evaluations at a few steps, a stop flag and a
  time budget;
- the mask-gated variant: the real model's gated stage, `mars_core.gate.attach_gate`'s adapters
  (active only where the input is the mask, so every real token, and tau = 1, stay the AR model's)
  trained with `training.gated_stage.example_loss` (one no-grad clean pass per example, groups of
  masks after response positions) on the same synthetic examples tokenised by `training.data`.

Nothing is written to disk: the trained weights come back in memory (`Result.state`), the curve
and the evaluations through `on_event(dict)`. One command measures a recipe:

    python -m training.tiny_live --objective paper --steps 120 --threads 1
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from training.loop import Run
from training.tiny_eval import BUNDLED_AR, Evaluator

OBJECTIVES = ("paper", "gated")
# The learning rate each objective measured best at in a few minutes (docs/playground.md, "Train"): the
# adapters start at zero and learn fast; the whole model at 5e-3 would forget its AR path at once.
LR_FOR = {"gated": 5e-3, "paper": 5e-4}
STOP_EARLY = "stopped"  # Stop pressed: the weights trained so far are kept
OUT_OF_TIME = "time budget"  # the run's time budget ran out: kept as well


@dataclass(frozen=True)
class LiveRecipe:
    """One Train-tab run. Defaults: measured on a 2-core CPU to finish in a few minutes with one
    thread (docs/playground.md, "Train")."""

    objective: str = "gated"  # "gated": adapters at the masks only; "paper": mars_loss on the whole model
    block_size: int = 4
    ar_weight: float = 8.0  # weight of the clean (SFT) term; the paper's objective only
    sft: bool = True  # False: the paper's "w/o SFT loss" ablation (ar_weight 0)
    lr: float = 5e-3  # the gated adapters' (LR_FOR["paper"] for the whole model)
    steps: int = 120
    batch_size: int = 16
    max_length: int = 160  # tokens; longer examples are skipped (a step's time grows with the longest)
    rank: int = 64  # gated adapters' rank
    groups: int = 48  # gated: groups of masks per example, after random response positions
    targets: str = "hard"  # gated: "hard" (the answer's token) or "soft" (KL to the base's own distribution)
    evals: int = 4  # evaluations after step 0 (the last one at the end)
    eval_n: int = 16  # held-out problems per evaluation
    seed: int = 0
    threads: int = 1
    budget_s: float = 300.0  # the whole run, set-up and evaluations included

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.targets not in ("hard", "soft"):
            raise ValueError(f"targets must be hard or soft, got {self.targets!r}")
        for name in ("block_size", "steps", "batch_size", "max_length", "rank", "groups", "eval_n", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (B = 1 is AR), got {self.block_size}")
        if not self.lr > 0 or not self.ar_weight >= 0 or not self.budget_s > 0:
            raise ValueError(f"lr and budget_s must be > 0 and ar_weight >= 0, got {self.lr}, {self.budget_s}, "
                             f"{self.ar_weight}")

    @property
    def clean_weight(self) -> float:
        return self.ar_weight if self.sft else 0.0


@dataclass
class Result:
    status: str  # "finished", STOP_EARLY or OUT_OF_TIME
    steps: int
    seconds: float
    state: dict  # paper: the model's state_dict; gated: the adapters (`mars_core.gate.gate_state`)
    recipe: LiveRecipe
    curve: list = field(default_factory=list)  # {"step", "noisy", "clean"}
    evals: list = field(default_factory=list)  # Evaluator.run's dicts, with "step"


class Clock:
    """The run's time budget: training stops early enough that the last evaluation fits in it."""

    def __init__(self, budget_s: float):
        self.start, self.budget = time.perf_counter(), budget_s
        self.eval_s = 0.0  # the longest evaluation so far: what the final one will take

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self) -> bool:
        return self.elapsed + 1.2 * self.eval_s >= self.budget


def eval_steps(total: int, evals: int) -> set[int]:
    """The steps evaluated after step 0: `evals` of them, evenly spaced, the last at `total`."""
    return {max(1, round(total * (i + 1) / evals)) for i in range(max(evals, 1))}


class LiveRun(Run):
    """`training.loop.Run` with its log and checkpoints sent to `on_event` instead of the disk."""

    def live(self, recipe: LiveRecipe, on_event: Callable[[dict], None], evaluator: Evaluator, clock: Clock):
        self.recipe, self.on_event, self.evaluator, self.clock = recipe, on_event, evaluator, clock
        self.curve, self.evals, self.at = [], [], eval_steps(self.total_steps, recipe.evals)
        return self

    def record(self, parts: dict, tokens: int, seconds: float) -> None:
        point = {"step": self.state.step, "noisy": parts["noisy"], "clean": parts["clean"]}
        self.curve.append(point)
        self.on_event({"type": "step", **point, "total": self.total_steps, "elapsed": self.clock.elapsed,
                       "lr": self.scheduler.get_last_lr()[0]})

    def checkpoint(self) -> None:
        """Nothing on disk: the caller takes the weights from memory."""

    def evaluate(self) -> None:
        model = self.acc.unwrap_model(self.model)
        model.eval()
        got = self.evaluator.run(model, self.tokenizer, self.recipe.block_size, self.state.step, self.clock)
        model.train()
        self.evals.append(got)
        self.on_event({"type": "eval", **got})

    def after_step(self, sums, micro, tokens, seconds, stop) -> str | None:
        status = super().after_step(sums, micro, tokens, seconds, stop)
        if status == "interrupted":
            status = STOP_EARLY
        elif status is None and self.clock.out_of_time():
            status = OUT_OF_TIME
        if status or self.state.step in self.at:
            self.evaluate()
        return status


def paper_run(recipe: LiveRecipe, on_event, stop, evaluator: Evaluator, clock: Clock, init: str) -> Result:
    """The MARS stage of the command line (`training.setup` + `training.loop`), in memory."""
    from training.checkpoint import TrainState
    from training.setup import make_accelerator, setup
    from training.train import release
    from training.train_config import TrainConfig

    config = TrainConfig(stage="mars", output="(in memory)", init=init, data="synthetic",
                         num_examples=recipe.steps * recipe.batch_size + 64, data_seed=recipe.seed,
                         max_length=recipe.max_length, batch_size=recipe.batch_size, lr=recipe.lr,
                         max_steps=recipe.steps, block_size=recipe.block_size, ar_weight=recipe.clean_weight,
                         mixed_precision="no", save_every=0, log_every=1, seed=recipe.seed, threads=recipe.threads,
                         quiet=True)
    acc = make_accelerator(config)
    try:
        torch.set_num_threads(recipe.threads)  # after Accelerator, which may set its own
        model, tok, optimizer, scheduler, loader, sampler, total, info = setup(acc, config)
        unwrapped = acc.unwrap_model(model)
        run = LiveRun(acc, config, model, tok, optimizer, scheduler, loader, sampler, total, TrainState())
        run.live(recipe, on_event, evaluator, clock)
        on_event({"type": "start", "total": total, "examples": info["examples"], "elapsed": clock.elapsed})
        unwrapped.eval()
        run.evals.append(evaluator.run(unwrapped, tok, recipe.block_size, 0, clock))
        on_event({"type": "eval", **run.evals[-1]})
        unwrapped.train()
        status = run.run(stop)
        state = {k: v.detach().clone() for k, v in unwrapped.state_dict().items()}
        return Result(status, run.state.step, clock.elapsed, state, recipe, run.curve, run.evals)
    finally:
        release(acc)


def gated_examples(tokenizer, recipe: LiveRecipe) -> list[tuple[list[int], int]]:
    """(ids, response start) of synthetic training examples, tokenised as the paper's stage does."""
    from mars_core.loss import IGNORE
    from training.data import build_dataset, load_records

    records = load_records("synthetic", num_examples=recipe.steps * recipe.batch_size + 64, seed=recipe.seed)
    dataset, _ = build_dataset(tokenizer, records.conversations, recipe.max_length)
    return [(list(x.input_ids), next(i for i, y in enumerate(x.labels) if y != IGNORE)) for x in dataset.examples]


def gated_run(recipe: LiveRecipe, on_event, stop, evaluator: Evaluator, clock: Clock, init: str) -> Result:
    """The real model's gated stage (`training.gated_stage.example_loss`, its lr schedule and batch
    order from `training.schedule`) on the tiny AR model, in memory."""
    from mars_core import load_model
    from mars_core.gate import attach_gate, gate_state
    from training.gated_stage import distance_weights, example_loss, loss_args
    from training.schedule import batch_at, lr_at

    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    model, tok = load_model(init, dtype=torch.float32, device="cpu")
    model.requires_grad_(False)
    params = attach_gate(model, tok.mask_token_id, recipe.rank, trainable=True, dtype=torch.float32)
    examples = gated_examples(tok, recipe)
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0, betas=(0.9, 0.95))
    args = loss_args(groups=recipe.groups, block_size=recipe.block_size, targets=recipe.targets)
    weights = distance_weights(None, recipe.block_size)
    total, curve, evals, at = recipe.steps, [], [], eval_steps(recipe.steps, recipe.evals)
    on_event({"type": "start", "total": total, "examples": len(examples), "elapsed": clock.elapsed})

    def evaluate(step: int) -> None:
        model.eval()
        evals.append(evaluator.run(model, tok, recipe.block_size, step, clock))
        on_event({"type": "eval", **evals[-1]})
        model.train()

    evaluate(0)
    step, status = 0, "finished"
    while step < total:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total, recipe.lr, max(1, math.ceil(0.03 * total)))
        batch = batch_at(step, len(examples), recipe.batch_size, recipe.seed)
        gen = torch.Generator().manual_seed(recipe.seed * 1_000_003 + step)
        noisy = 0.0
        for i in batch:
            ids, start = examples[i]
            loss, stats = example_loss(model, ids, start, args, weights, gen, contextlib.nullcontext)
            (loss / len(batch)).backward()
            noisy += stats["hard"] / len(batch)  # the masks' CE on the answer: comparable across objectives
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        point = {"step": step, "noisy": noisy, "clean": None}  # clean: the base's own, unchanged by construction
        curve.append(point)
        on_event({"type": "step", **point, "total": total, "elapsed": clock.elapsed,
                  "lr": optimizer.param_groups[0]["lr"]})
        if stop.requested:
            status = STOP_EARLY
        elif step < total and clock.out_of_time():
            status = OUT_OF_TIME
        if step in at or status != "finished":
            evaluate(step)
        if status != "finished":
            break
    return Result(status, step, clock.elapsed, gate_state(model), recipe, curve, evals)


class NoStop:
    requested = False


def train_live(recipe: LiveRecipe, on_event: Callable[[dict], None] = lambda e: None, stop=None,
               init: str = BUNDLED_AR, evaluator: Evaluator | None = None) -> Result:
    """Run `recipe` from `init`; `stop.requested` (read after every step) ends it early, keeping
    what was trained. The time budget counts from here."""
    clock = Clock(recipe.budget_s)
    evaluator = evaluator or Evaluator(recipe.eval_n)
    run = paper_run if recipe.objective == "paper" else gated_run
    return run(recipe, on_event, stop or NoStop(), evaluator, clock, init)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.tiny_live", description=__doc__.split("\n")[0])
    defaults = LiveRecipe()
    for f in LiveRecipe.__dataclass_fields__.values():
        value = getattr(defaults, f.name)
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(value, bool) else type(value)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=value)
    p.add_argument("--final-n", type=int, default=0, help="then evaluate the trained model on N other held-out problems")
    a = vars(p.parse_args(argv))
    final_n = a.pop("final_n")
    recipe = LiveRecipe(**a)
    torch.set_num_threads(recipe.threads)

    def show(e: dict) -> None:
        if e["type"] != "step" or e["step"] % 20 == 0:
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in e.items()}), flush=True)

    res = train_live(recipe, show)
    print(json.dumps({"status": res.status, "steps": res.steps, "seconds": round(res.seconds, 1),
                      "threads": torch.get_num_threads(), "recipe": asdict(recipe)}), flush=True)
    if final_n:
        from training.tiny_eval import held_out_check

        print(json.dumps(held_out_check(res, final_n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
