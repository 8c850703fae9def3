"""The run folder: atomic checkpoints, --resume, the log, the final model.

A checkpoint is written to ``checkpoints/.tmp-step-N`` and renamed when complete, so a crash
never leaves a half-written ``step-N``; files are written through a temp file and a rename.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from training.train_config import TrainConfig

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CKPT_DIR, STATE_FILE = "checkpoints", "trainer_state.json"
LOG_FILE, CONFIG_FILE = "train_log.jsonl", "training_config.json"
CKPT_NAME = re.compile(r"^step-(\d+)$")
# Options that may change between a run and its --resume; all others must match.
RESUME_FREE = frozenset({"output", "resume", "overwrite", "stop_at", "save_every", "keep_checkpoints",
                         "log_every", "threads", "quiet"})


def list_checkpoints(output: str) -> list[tuple[int, str]]:
    """Complete checkpoints (those with a trainer_state.json), oldest first."""
    root = os.path.join(output, CKPT_DIR)
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        match = CKPT_NAME.match(name)
        if match and os.path.isfile(os.path.join(root, name, STATE_FILE)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def check_output(config: TrainConfig) -> str | None:
    """The checkpoint to resume from (None: start fresh). Refuses to mix two runs in one folder."""
    existing = list_checkpoints(config.output)
    if config.resume:
        return existing[-1][1] if existing else None
    finished = os.path.isfile(os.path.join(config.output, CONFIG_FILE))
    if (existing or finished) and not config.overwrite:
        raise ValueError(f"{config.output!r} already holds a training run "
                         f"({'checkpoints/' if existing else CONFIG_FILE}); "
                         "pass --resume to continue it or --overwrite to start over")
    return None


def clear_output(output: str) -> None:
    """Remove an earlier run's checkpoints, log and run record (main process only)."""
    shutil.rmtree(os.path.join(output, CKPT_DIR), ignore_errors=True)
    for name in (LOG_FILE, CONFIG_FILE):
        path = os.path.join(output, name)
        if os.path.exists(path):
            os.remove(path)


def remove_partial(output: str) -> None:
    """Remove what an earlier crash left half-written (temp checkpoint / final-model folders)."""
    root = os.path.join(output, CKPT_DIR)
    partial = [os.path.join(root, n) for n in os.listdir(root) if n.startswith(".tmp-")] if os.path.isdir(root) else []
    for path in partial + [os.path.join(output, ".tmp-final")]:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint so --resume continues exactly."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches this rank consumed in `epoch`
    tokens: int = 0  # non-pad tokens, all ranks
    seconds: float = 0.0  # training time, checkpoint writing excluded
    window: dict = dataclasses.field(default_factory=dict)  # loss sums since the last log record


def save_checkpoint(accelerator: Accelerator, config: TrainConfig, state: TrainState) -> str:
    """Write checkpoints/.tmp-step-N, then rename it to step-N; keep the newest K."""
    root = os.path.join(config.output, CKPT_DIR)
    tmp = os.path.join(root, f".tmp-step-{state.step}")
    final = os.path.join(root, f"step-{state.step}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    accelerator.wait_for_everyone()
    with quiet_tied_weight_warning():
        accelerator.save_state(tmp)  # every rank: its RNG state; main: model, optimizer, scheduler
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        payload = {**dataclasses.asdict(state), "world_size": accelerator.num_processes,
                   "config": dataclasses.asdict(config)}
        write_json(os.path.join(tmp, STATE_FILE), payload)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for _, old in list_checkpoints(config.output)[: -config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


@contextlib.contextmanager
def quiet_tied_weight_warning() -> Iterator[None]:
    """accelerate warns at every checkpoint that it left out the tied lm_head copy; loading
    re-ties it (the resume test checks bit-equality), so the warning is only noise."""
    logger = logging.getLogger("accelerate.utils.other")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def changed_options(saved: dict, config: TrainConfig, ignore: frozenset = frozenset()) -> str:
    """The options (outside RESUME_FREE and `ignore`) in which `config` differs from a recorded
    run's args, as "name: old -> new, ..."; empty when it is the same run."""
    now = json.loads(json.dumps(dataclasses.asdict(config)))
    free = RESUME_FREE | ignore
    changed = sorted(k for k, v in saved.items() if k not in free and now.get(k) != v)
    return ", ".join(f"{k}: {saved[k]!r} -> {now.get(k)!r}" for k in changed)


def load_checkpoint(accelerator: Accelerator, config: TrainConfig, path: str) -> TrainState:
    """Restore model/optimizer/scheduler/RNG from `path` after checking the run matches."""
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as f:
        saved = json.load(f)
    diffs = changed_options(saved["config"], config)
    if diffs:
        raise ValueError(f"cannot resume {path}: options differ from the checkpointed run ({diffs})")
    if saved["world_size"] != accelerator.num_processes:
        raise ValueError(f"cannot resume {path}: it was written by {saved['world_size']} processes, "
                         f"this run has {accelerator.num_processes}")
    accelerator.load_state(path)
    fields = {f.name for f in dataclasses.fields(TrainState)}
    return TrainState(**{k: v for k, v in saved.items() if k in fields})


def write_text(path: str, text: str) -> bool:
    """Write `text` through a temp file + rename, so readers never see half a file. A file that
    already holds `text` is left untouched (a resumed build rewrites nothing); returns whether it wrote."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def hold_folder(folder: str):
    """An exclusive lock on a run folder for as long as the returned file is open (its `.lock`, flock):
    a second process started on a folder that one is training would interleave two runs' steps in one
    latest.pt. The lock goes with its process, so a killed run never leaves a stale one behind."""
    import fcntl

    os.makedirs(folder, exist_ok=True)
    f = open(os.path.join(folder, ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(f"{folder} is being trained by another process now: wait for it to stop, "
                         "or give another --out") from None
    return f


def write_json(path: str, payload: dict) -> bool:
    """`write_text` of `payload` as indented JSON."""
    return write_text(path, json.dumps(payload, indent=2))


def trim_log(output: str, step: int) -> None:
    """Drop log records past `step` (written after the checkpoint we resume from)."""
    path = os.path.join(output, LOG_FILE)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(kept)


def save_final_model(accelerator: Accelerator, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     output: str) -> None:
    """A standard HF folder in `output`: saved into a temp folder, then each file moved in."""
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)  # every rank (DeepSpeed gathers here)
    if not accelerator.is_main_process:
        return
    tmp = os.path.join(output, ".tmp-final")
    shutil.rmtree(tmp, ignore_errors=True)
    unwrapped.config.use_cache = True  # inference default
    eos = unwrapped.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    eos.add(tokenizer.eos_token_id)
    unwrapped.generation_config.eos_token_id = sorted(eos) if len(eos) > 1 else tokenizer.eos_token_id
    unwrapped.generation_config.pad_token_id = tokenizer.pad_token_id
    unwrapped.save_pretrained(tmp, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    unwrapped.config.use_cache = False
    for name in os.listdir(tmp):
        os.replace(os.path.join(tmp, name), os.path.join(output, name))
    os.rmdir(tmp)
