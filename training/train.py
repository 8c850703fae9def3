"""MARS training: stage 1 (AR SFT) and stage 2 (MARS) through Hugging Face accelerate.

Stage ``ar`` is ordinary supervised fine-tuning: next-token cross-entropy on assistant tokens.
Stage ``mars`` starts from a stage-1 checkpoint and minimises
``CE(noisy half) + ar_weight * CE(clean half)`` from one forward of ``[noisy | clean]``
(``mars_core.mars_loss``). Models load with ``attn_implementation="sdpa"`` (eager attention
silently ignores a boolean 4-D mask) and train in fp32 master weights (``--mixed-precision bf16``
autocasts the forward).

Launch it any of these ways (one process per device; ``--batch-size`` is per process)::

    python -m training.train --stage ar --tokenizer TOK --model-config tiny --output OUT/ar ...
    accelerate launch --config_file training/configs/accelerate_multi_gpu.yaml -m training.train ...
    torchrun --nproc_per_node 2 -m training.train --threads 1 ...        # CPU: gloo backend

Output folder layout::

    OUT/config.json, model.safetensors, generation_config.json, tokenizer files   final model
    OUT/training_config.json      every option, stage, steps, seconds, tokens/s, peak memory
    OUT/train_log.jsonl           one JSON record per --log-every optimizer steps
    OUT/checkpoints/step-N/       accelerate state (model, optimizer, scheduler, RNG per rank)
                                  + trainer_state.json (step, epoch, batch in epoch, config)

A checkpoint is written to ``checkpoints/.tmp-step-N`` and renamed when complete, so a crash
never leaves a half-written ``step-N``; ``--resume`` continues from the newest one with the
same optimizer, schedule, RNG and data position (the data order equals an uninterrupted run's).
Ctrl-C or SIGTERM finishes the current optimizer step, saves a checkpoint and exits (press
Ctrl-C twice to abort at once).

The pieces: train_config.py (`TrainConfig` and the CLI), setup.py (accelerator, model and
tokenizer, data, optimizer), loop.py (the loss and the loop), checkpoint.py (the run folder:
checkpoints, resume, log, final model), signals.py (Ctrl-C / SIGTERM); this file ties them
together (`train`, `main`).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING

import torch

from training.checkpoint import (CONFIG_FILE, TrainState, check_output, clear_output, load_checkpoint,
                                 remove_partial, save_final_model, trim_log, write_json)
from training.loop import Run
from training.setup import make_accelerator, peak_memory_mb, setup
from training.signals import StopSignal
from training.train_config import TrainConfig, build_parser, config_from_args

if TYPE_CHECKING:
    from accelerate import Accelerator


def summarize(run: Run, config: TrainConfig, status: str, data_info: dict, started: float) -> dict:
    """The run's record: written to training_config.json and returned by `train`."""
    from accelerate.utils import gather_object

    acc, state = run.acc, run.state
    hashes = gather_object([run.first_batch_sha1])
    unwrapped = acc.unwrap_model(run.model)
    return {
        "status": status, "stage": config.stage, "args": dataclasses.asdict(config),
        "block_size": config.block_size if config.stage == "mars" else None,
        "ar_weight": config.ar_weight if config.stage == "mars" else None,
        "lr": config.learning_rate, "mixed_precision": acc.mixed_precision,
        "steps": state.step, "total_steps": run.total_steps, "epoch": state.epoch,
        "seconds": round(state.seconds, 3), "wall_seconds": round(time.perf_counter() - started, 3),
        "tokens": state.tokens, "tokens_per_s": round(state.tokens / max(state.seconds, 1e-9), 1),
        "peak_memory_mb": round(peak_memory_mb(acc), 1), "device": acc.device.type,
        "world_size": acc.num_processes, "first_batch_sha1": hashes,
        "num_parameters": sum(p.numel() for p in unwrapped.parameters()),
        "examples": data_info["examples"], "skipped": data_info["skipped"], "output": config.output,
    }


def train(config: TrainConfig) -> dict:
    """Run (or resume) one training stage; returns the summary (see `summarize`)."""
    started = time.perf_counter()
    accelerator = make_accelerator(config)
    if config.threads:
        torch.set_num_threads(config.threads)  # after Accelerator, which sets its own on multi-CPU
    try:
        resume_from = check_output(config)
        if accelerator.is_main_process:
            os.makedirs(config.output, exist_ok=True)
            if config.overwrite:
                clear_output(config.output)
            remove_partial(config.output)
        accelerator.wait_for_everyone()
        model, tokenizer, optimizer, scheduler, loader, sampler, total, data_info = setup(accelerator, config)
        state = TrainState()
        if resume_from:
            state = load_checkpoint(accelerator, config, resume_from)
            if accelerator.is_main_process:
                trim_log(config.output, state.step)
        say(accelerator, config, f"{config.stage}: {data_info['examples']} examples "
            f"(skipped {data_info['skipped'] or 'none'}), {total} steps, world size {accelerator.num_processes}"
            + (f", resuming at step {state.step}" if resume_from else ""))
        run = Run(accelerator, config, model, tokenizer, optimizer, scheduler, loader, sampler, total, state)
        return finish(run, config, data_info, started)
    finally:
        release(accelerator)


def finish(run: Run, config: TrainConfig, data_info: dict, started: float) -> dict:
    """Run the loop with a progress bar, save the final model, write the run record."""
    from tqdm.auto import tqdm

    acc = run.acc
    if acc.is_main_process and not config.quiet:
        run.bar = tqdm(total=run.total_steps, initial=run.state.step, desc=f"train {config.stage}",
                       dynamic_ncols=True)
    try:
        with StopSignal() as stop:
            status = run.run(stop) if run.state.step < run.total_steps else "finished"
    finally:
        if run.bar is not None:
            run.bar.close()
    if status == "finished":
        run.checkpoint()
        save_final_model(acc, run.model, run.tokenizer, config.output)
    summary = summarize(run, config, status, data_info, started)
    if acc.is_main_process and status == "finished":
        write_json(os.path.join(config.output, CONFIG_FILE), summary)
    acc.wait_for_everyone()
    say(acc, config, f"{status} at step {run.state.step}/{run.total_steps}: {summary['tokens_per_s']:.0f} tokens/s, "
        f"peak memory {summary['peak_memory_mb']:.0f} MiB" + ("" if status == "finished" else
                                                             "; continue with --resume"))
    return summary


def say(accelerator: Accelerator, config: TrainConfig, message: str) -> None:
    """A console line from the main process (the CLI's only output besides the progress bar)."""
    if accelerator.is_main_process and not config.quiet:
        from tqdm.auto import tqdm

        tqdm.write(message)


def release(accelerator: Accelerator) -> None:
    """Forget accelerate's process-wide singletons after a single-process run, so another `train`
    call in the same process may use other settings (e.g. mixed precision). Distributed runs keep
    their process group."""
    from accelerate.state import AcceleratorState, GradientState

    if accelerator.num_processes == 1:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 when finished or stopped by --stop-at, 130 when interrupted, 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as e:
        build_parser().error(str(e))
    if config.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars
    try:
        summary = train(config)
    except ValueError as e:  # bad data, options or folders: one line, not a traceback
        print(f"python -m training.train: error: {e}", file=sys.stderr)
        return 2
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 130 if summary["status"] == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
