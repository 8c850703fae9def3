"""Build the bundled default models from scratch: tokenizer, AR SFT, MARS, ablations, evaluation,
model cards. Every step is skipped when its output is complete, so re-running the same command
after an interruption resumes where it stopped (inside a training stage, from its last checkpoint).

    python -m training.build_default --output runs/default            # the full recipe (CPU, ~2 h)
    python -m training.build_default --smoke --output /tmp/smoke       # the same chain in minutes

Outputs in OUTPUT: tokenizer/, tiny-ar-sft/, tiny-mars-b4/, tiny-draft/ (the small draft model
for speculative decoding; standard HF folders with a model card each), ablations/, eval/
(eval.json, frontier.html, ablations.json).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from typing import Callable, Iterable

import torch

from mars_core import DecodeConfig
from tasks.synthetic import make_examples
from training.checkpoint import changed_options, write_json, write_text
from training.evaluate import evaluate, evaluate_draft, summary_table, write_frontier
from training.model_card import write_cards, write_draft_card
from training.tokenizer import build_tokenizer, corpus_from_examples
from training.train import train
from training.recipe import Recipe
from training.train_config import TrainConfig


def complete(folder: str) -> bool:
    """A training output is complete once its final model and record are written."""
    record = os.path.join(folder, "training_config.json")
    if not (os.path.isfile(os.path.join(folder, "model.safetensors")) and os.path.isfile(record)):
        return False
    with open(record, encoding="utf-8") as f:
        return json.load(f).get("status") == "finished"


def stage(cfg: TrainConfig, log: Callable[[str], None]) -> dict:
    """Train one stage unless done; resume from its checkpoints when a previous try stopped."""
    if complete(cfg.output):
        with open(os.path.join(cfg.output, "training_config.json"), encoding="utf-8") as f:
            record = json.load(f)
        # A finished stage is reused only if it is the stage this recipe asks for: after a recipe
        # change, reusing it would silently ship a model the card does not describe. The input
        # folders are the build's own (tokenizer/, tiny-ar-sft/); their paths change when a build
        # folder is moved or copied, their content does not.
        diffs = changed_options(record["args"], cfg, ignore=frozenset({"init", "tokenizer"}))
        if diffs:
            raise ValueError(f"{cfg.output} holds a finished run of another recipe ({diffs}); "
                             "move it away (or pick a new --output) to train this one")
        log(f"[skip] {cfg.output} is complete")
        return record
    resume = os.path.isdir(os.path.join(cfg.output, "checkpoints")) and any(
        n.startswith("step-") for n in os.listdir(os.path.join(cfg.output, "checkpoints")))
    log(f"[train] {cfg.stage} -> {cfg.output}{' (resuming)' if resume else ''}")
    summary = train(replace(cfg, resume=resume, overwrite=not resume))
    if summary["status"] != "finished":
        raise KeyboardInterrupt(f"{cfg.output} stopped ({summary['status']}); re-run the same command to resume")
    return summary


def build(output: str, recipe: Recipe, threads: int | None = None, log: Callable[[str], None] = print) -> dict:
    os.makedirs(output, exist_ok=True)
    t0 = time.perf_counter()
    built = []  # outputs this invocation trained or evaluated; none -> a no-op that rewrites nothing

    def train_stage(cfg: TrainConfig) -> dict:
        if not complete(cfg.output):
            built.append(cfg.output)
        return stage(cfg, log)

    def evaluation(path: str, models: dict[str, str], settings: dict, run: Callable[[], dict]) -> dict:
        return cached_eval(path, models, settings, lambda: built.append(path) or run())
    tok_dir = os.path.join(output, "tokenizer")
    if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        log("[tokenizer] training BPE")
        corpus = corpus_from_examples(make_examples(recipe.tokenizer_examples, recipe.seed + 1000, "train"))
        build_tokenizer(corpus, recipe.vocab_size, tok_dir)
    common = dict(data="synthetic", num_examples=recipe.train_examples, data_seed=recipe.seed,
                  max_length=recipe.max_length, batch_size=recipe.batch_size, save_every=recipe.save_every,
                  seed=recipe.seed, threads=threads, mixed_precision="auto")
    ar_dir = os.path.join(output, "tiny-ar-sft")
    summaries = {"ar": train_stage(TrainConfig(stage="ar", output=ar_dir, tokenizer=tok_dir,
                                               model_config=recipe.model_config, max_steps=recipe.ar_steps,
                                               lr=recipe.ar_lr, **common))}

    def mars(name: str, B: int, ar_weight: float, steps: int) -> str:
        out = os.path.join(output, name)
        summaries[name] = train_stage(TrainConfig(stage="mars", output=out, init=ar_dir, block_size=B,
                                                  ar_weight=ar_weight, max_steps=steps,
                                                  lr=recipe.mars_lr, **common))
        return out

    mars_dir = mars(f"tiny-mars-b{recipe.block_size}", recipe.block_size, recipe.ar_weight, recipe.mars_steps)
    log("[eval] AR baseline and MARS tau sweep")
    base = DecodeConfig(max_new_tokens=recipe.max_new_tokens, cache="sliding")
    eval_dir = os.path.join(output, "eval")
    models = {"ar-baseline": ar_dir, "mars": mars_dir}
    settings = dict(n=recipe.eval_n, seed=recipe.seed, max_new_tokens=recipe.max_new_tokens)
    eval_json = os.path.join(eval_dir, "eval.json")
    result = evaluation(
        eval_json, models, {**settings, "taus": recipe.eval_taus},
        lambda: evaluate(models, recipe.eval_n, recipe.seed, recipe.eval_taus, (recipe.block_size,), base))
    if eval_json in built or not os.path.isfile(os.path.join(eval_dir, "frontier.html")):
        write_frontier(result, eval_dir)  # drawn from eval.json: redrawn only when that changed

    # The small draft model for speculative decoding (mode="spec"), before the ablations: it is
    # shipped, they are not.
    draft_dir = os.path.join(output, "tiny-draft")
    draft_summary = train_stage(TrainConfig(stage="ar", output=draft_dir, tokenizer=tok_dir,
                                                 model_config=recipe.draft_config, max_steps=recipe.draft_steps,
                                                 lr=recipe.ar_lr, **common))
    log("[eval] draft model: AR, and drafting for the MARS model")
    draft_result = evaluation(
        os.path.join(draft_dir, "eval.json"), {"draft": draft_dir, "same-size draft": ar_dir, "target": mars_dir},
        {**settings, "K": recipe.draft_tokens},
        lambda: evaluate_draft(draft_dir, ar_dir, mars_dir, recipe, base))
    write_draft_card(draft_dir, recipe, draft_summary, draft_result)

    ablations = {B: f"ablations/mars-b{B}-no-sft" for B in recipe.ablation_block_sizes}
    if not all(complete(os.path.join(output, name)) for name in ablations.values()):
        # the main models are usable from here on, before the ablations train
        write_cards(output, recipe, summaries, result, [])
    log(summary_table(result))
    # Ablation "w/o SFT loss" at each block size: the main run's lr and data, `ablation_steps` steps.
    ablation_runs = []
    for B, name in ablations.items():
        label = f"MARS w/o SFT loss B={B}"
        path = mars(name, B, 0.0, recipe.ablation_steps)
        log(f"[eval] ablation {label}")
        r = evaluation(
            os.path.join(output, name, "eval.json"), {label: path}, {**settings, "B": B},
            lambda: evaluate({label: path}, recipe.eval_n, recipe.seed, (1.0, 0.95), (B,), base))
        ablation_runs += r["runs"]
    write_json(os.path.join(eval_dir, "ablations.json"), {"runs": ablation_runs})
    record = {"recipe": recipe.__dict__, "summaries": {**summaries, "tiny-draft": draft_summary}, "build_seconds": time.perf_counter() - t0,
              "torch_threads": torch.get_num_threads()}
    # build.json times the invocation that built something; a no-op re-run keeps that record.
    if built or not os.path.isfile(os.path.join(output, "build.json")):
        write_text(os.path.join(output, "build.json"), json.dumps(record, indent=2, default=str))
    write_cards(output, recipe, summaries, result, ablation_runs)
    log(summary_table({"runs": ablation_runs}))
    return record


def eval_digest(folders: Iterable[str], settings: dict) -> str:
    """sha256 over the weights of `folders` and the evaluation settings: what a result depends on."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for folder in folders:
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def cached_eval(path: str, models: dict[str, str], settings: dict, run: Callable[[], dict]) -> dict:
    """Evaluation results survive an interrupted build: reuse `path` when it holds the result for
    these weights and settings, so a retrained model is never shown with its predecessor's numbers."""
    digest = eval_digest(models.values(), settings)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        if result.get("eval_sha256") == digest:
            return result
    result = {**run(), "eval_sha256": digest}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, result)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.build_default", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="folder for every artefact of the build")
    p.add_argument("--smoke", action="store_true", help="the same chain on a micro model and little data")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--install", metavar="ASSETS_DIR",
                   help="after the build, copy the two model folders here (e.g. assets/models)")
    a = p.parse_args(argv)
    recipe = Recipe.smoke() if a.smoke else Recipe.full()
    try:
        build(a.output, recipe, a.threads)
    except KeyboardInterrupt as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 130
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.install:
        for name in ("tiny-ar-sft", f"tiny-mars-b{recipe.block_size}", "tiny-draft"):
            install(os.path.join(a.output, name), os.path.join(a.install, name))
    return 0


SHIPPED = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
           "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
           "training_config.json", "README.md", "frontier.html", "frontier.png", "eval.json")


def install(src: str, dst: str) -> None:
    """Copy a model folder's shippable files (no checkpoints, no logs) into the assets tree."""
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in SHIPPED:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(tmp, name))
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


if __name__ == "__main__":
    sys.exit(main())
