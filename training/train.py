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
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass

import torch

from training.data import Collator, LengthGroupedBatchSampler, build_dataset, load_records

STAGES = ("ar", "mars")
MIXED_PRECISION = ("no", "bf16", "auto")
CKPT_DIR, STATE_FILE = "checkpoints", "trainer_state.json"
LOG_FILE, CONFIG_FILE = "train_log.jsonl", "training_config.json"
CKPT_NAME = re.compile(r"^step-(\d+)$")
# Learning rates when --lr is not given: the paper's for fine-tuning a pretrained model, and
# one a few-million-parameter model trained from scratch actually learns with.
LR_FINETUNE, LR_SCRATCH = 5e-6, 1e-3
# Options that may change between a run and its --resume; all others must match.
RESUME_FREE = frozenset({"output", "resume", "overwrite", "stop_at", "save_every", "keep_checkpoints",
                         "log_every", "threads", "quiet"})

PRESETS = {
    # ~0.2M parameters: tests and smoke runs
    "micro": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2),
    # ~3M parameters: learns the synthetic tasks on a CPU
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
}
PRESET_COMMON = dict(tie_word_embeddings=True, max_position_embeddings=512, rms_norm_eps=1e-6)


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; validated on construction. See `build_parser` for
    the meaning of each field (the CLI flag is the field name with dashes)."""

    stage: str
    output: str
    init: str | None = None
    model_config: str | None = None
    tokenizer: str | None = None
    data: str = "synthetic"
    num_examples: int | None = None
    data_seed: int = 0
    max_length: int = 512
    truncate: bool = False
    batch_size: int = 8
    grad_accum: int = 1
    lr: float | None = None
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    max_grad_norm: float = 1.0
    max_steps: int | None = None
    epochs: int | None = None
    block_size: int = 4
    ar_weight: float = 1.0
    mixed_precision: str = "auto"
    save_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    stop_at: int | None = None
    threads: int | None = None
    quiet: bool = False

    def __post_init__(self):
        self._check_sources()
        self._check_numbers()
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other; pass one")

    def _check_sources(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if not self.output or not str(self.output).strip():
            raise ValueError("output must be a folder path")
        if self.stage == "mars" and not self.init:
            raise ValueError("stage 'mars' starts from a stage-1 (AR SFT) checkpoint: pass --init")
        if self.init:
            if self.tokenizer or self.model_config:
                raise ValueError("with --init the checkpoint's tokenizer and architecture are used; "
                                 "drop --tokenizer / --model-config")
        elif not (self.tokenizer and self.model_config):
            raise ValueError("training from scratch needs --tokenizer DIR and --model-config "
                             f"({'|'.join(PRESETS)}|FILE.json); or pass --init CKPT")
        if not self.data or not str(self.data).strip():
            raise ValueError("data must be a JSONL path, 'synthetic' or a dataset name")

    def _check_numbers(self):
        positive = ("max_length", "batch_size", "grad_accum", "block_size", "keep_checkpoints", "log_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("num_examples", "max_steps", "epochs", "stop_at", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 (or unset), got {value!r}")
        if self.max_steps is not None and self.epochs is not None:
            raise ValueError("give --max-steps or --epochs, not both")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        checks = (("weight_decay", self.weight_decay >= 0), ("max_grad_norm", self.max_grad_norm >= 0),
                  ("ar_weight", self.ar_weight >= 0), ("save_every", self.save_every >= 0),
                  ("warmup_ratio", 0 <= self.warmup_ratio < 1))
        for name, ok in checks:
            if not ok:
                raise ValueError(f"{name} is out of range: {getattr(self, name)!r}")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return LR_FINETUNE if self.init else LR_SCRATCH


def build_parser() -> argparse.ArgumentParser:
    """The CLI; every flag maps to the TrainConfig field of the same name."""
    p = argparse.ArgumentParser(
        prog="python -m training.train",
        description="Train stage 1 (AR SFT) or stage 2 (MARS) of a causal LM with accelerate. "
                    "Works under python, `accelerate launch` and `torchrun`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--stage", required=True, choices=STAGES, help="ar: plain SFT; mars: MARS training (needs --init)")
    add("--output", required=True, help="run folder: final model, log, checkpoints/")
    add("--init", help="start from this checkpoint (stage-1 output or any HF causal-LM folder/hub id); "
                       "its tokenizer is used. Required for --stage mars")
    add("--model-config", help=f"from scratch: a preset ({', '.join(PRESETS)}) or a JSON file of Qwen2Config "
                               "fields; vocab_size is always len(tokenizer)")
    add("--tokenizer", help="from scratch: tokenizer folder (e.g. from python -m training.tokenizer)")
    add("--data", default="synthetic", help="a chat JSONL file, 'synthetic', or a Hugging Face dataset name")
    add("--num-examples", type=int, help="synthetic: examples to generate (default 10000); "
                                         "other sources: use at most this many")
    add("--data-seed", type=int, default=0, help="seed of the synthetic data")
    add("--max-length", type=int, default=512, help="longest example in tokens (prompt + response)")
    add("--truncate", action="store_true", help="cut longer examples to --max-length instead of skipping them")
    add("--batch-size", type=int, default=8, help="examples per micro-batch per process")
    add("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    add("--lr", type=float, help=f"peak learning rate (default {LR_FINETUNE} with --init, {LR_SCRATCH} from scratch)")
    add("--weight-decay", type=float, default=0.0, help="AdamW weight decay (matrices only)")
    add("--warmup-ratio", type=float, default=0.03, help="share of steps for linear warm-up before cosine decay")
    add("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (0: off)")
    add("--max-steps", type=int, help="optimizer steps to train (instead of --epochs)")
    add("--epochs", type=int, help="epochs to train (default 1 when --max-steps is not given)")
    add("--block-size", type=int, default=4, help="mars: block size B")
    add("--ar-weight", type=float, default=1.0, help="mars: weight of the clean (SFT) loss; 0 = 'w/o SFT loss'")
    add("--mixed-precision", default="auto", choices=MIXED_PRECISION,
        help="auto: the accelerate launcher's setting, else bf16 on a GPU that has it, else no")
    add("--save-every", type=int, default=500, help="checkpoint every N optimizer steps (0: only at the end)")
    add("--keep-checkpoints", type=int, default=2, help="keep the newest K checkpoints")
    add("--log-every", type=int, default=10, help="write a train_log.jsonl record every N steps")
    add("--seed", type=int, default=0, help="seed of model init and data order")
    add("--resume", action="store_true", help="continue from the newest checkpoint in --output (fresh if none)")
    add("--overwrite", action="store_true", help="discard the checkpoints and log of an earlier run in --output")
    add("--stop-at", type=int, help="save a checkpoint and stop after this step, keeping the full run's "
                                    "schedule (for job time limits; continue with --resume)")
    add("--threads", type=int, help="torch.set_num_threads for this process")
    add("--quiet", action="store_true", help="no progress bar or messages")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})


# --------------------------------------------------------------------------
# Model, tokenizer, data
# --------------------------------------------------------------------------

def qwen2_config(spec: str, tokenizer):
    """A Qwen2Config from a preset name or a JSON file, sized to the tokenizer."""
    from transformers import Qwen2Config

    if spec in PRESETS:
        fields = {**PRESET_COMMON, **PRESETS[spec]}
    elif os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            fields = json.load(f)
        if not isinstance(fields, dict):
            raise ValueError(f"{spec}: expected a JSON object of Qwen2Config fields")
        fields = {k: v for k, v in fields.items() if k not in ("model_type", "architectures", "vocab_size")}
    else:
        raise ValueError(f"--model-config {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file")
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.bos_token_id)
    config = Qwen2Config(**{**fields, **ids, "vocab_size": len(tokenizer)})
    config._attn_implementation = "sdpa"  # a boolean 4-D mask is ignored under eager
    return config


GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def declared_tokenizer(folder: str, fallback=None):
    """The tokenizer a local folder declares in tokenizer_config.json.

    For a qwen2 model folder AutoTokenizer (transformers 5) swaps a generic `TokenizersBackend`
    for Qwen2Tokenizer, which rebuilds the pre-tokenizer its own way and adds an
    `<|endoftext|>` token past the embedding matrix: not the tokenizer the model was trained
    with. A generic declaration is therefore loaded as such; anything else via AutoTokenizer
    (or `fallback`, when given).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = os.path.join(folder, "tokenizer_config.json")
    declared = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            declared = json.load(f).get("tokenizer_class")
    if declared in GENERIC_TOKENIZERS:
        return PreTrainedTokenizerFast.from_pretrained(folder)
    return fallback if fallback is not None else AutoTokenizer.from_pretrained(folder)


def load_model_and_tokenizer(config: TrainConfig):
    """fp32 model (sdpa attention) and tokenizer with a mask token: from --init or from scratch."""
    from mars_core import load_model
    from mars_core.loading import ensure_mask_token
    from mars_core.prompts import MASK_TOKEN
    from transformers import Qwen2ForCausalLM

    if config.init:
        model, tokenizer = load_model(config.init, dtype=torch.float32, device="cpu")
        if os.path.isdir(config.init):
            tokenizer = declared_tokenizer(config.init, fallback=tokenizer)
            ensure_mask_token(model, tokenizer)
    else:
        tokenizer = declared_tokenizer(config.tokenizer)
        if tokenizer.mask_token is None:  # before sizing the model, so the row exists from the start
            tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        model = Qwen2ForCausalLM(qwen2_config(config.model_config, tokenizer)).float()
        ensure_mask_token(model, tokenizer)
    if model.config._attn_implementation != "sdpa":
        raise ValueError(f"the model uses {model.config._attn_implementation!r} attention; MARS needs 'sdpa'")
    if tokenizer.pad_token is None:  # pads only masked-out slots; any id works
        tokenizer.pad_token = tokenizer.eos_token
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and config.max_length > limit:
        raise ValueError(f"--max-length {config.max_length} exceeds the model's {limit} positions")
    model.config.use_cache = False  # no KV cache while training
    model.train()
    return model, tokenizer


def load_training_data(config: TrainConfig, tokenizer):
    """The tokenised dataset and a description (counts, skips by reason)."""
    records = load_records(config.data, num_examples=config.num_examples, seed=config.data_seed)
    dataset, too_long = build_dataset(tokenizer, records.conversations, config.max_length, config.truncate)
    skipped = dict(records.skipped)
    for reason, count in too_long.items():
        skipped[reason] = skipped.get(reason, 0) + count
    if len(dataset) == 0:
        raise ValueError(f"no usable training examples in {config.data!r} (skipped: {skipped or 'none'})")
    return dataset, {"examples": len(dataset), "skipped": skipped}


def param_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; biases and norm scales are not decayed (standard practice)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


# --------------------------------------------------------------------------
# Output folder and checkpoints
# --------------------------------------------------------------------------

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


def save_checkpoint(accelerator, config: TrainConfig, state: TrainState) -> str:
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
def quiet_tied_weight_warning():
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


def load_checkpoint(accelerator, config: TrainConfig, path: str) -> TrainState:
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


def write_json(path: str, payload: dict) -> None:
    """Write JSON through a temp file + rename, so readers never see half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)


def trim_log(output: str, step: int) -> None:
    """Drop log records past `step` (written after the checkpoint we resume from)."""
    path = os.path.join(output, LOG_FILE)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(kept)


def save_final_model(accelerator, model, tokenizer, output: str) -> None:
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


# --------------------------------------------------------------------------
# Stopping on a signal
# --------------------------------------------------------------------------

class StopSignal:
    """While active, SIGINT/SIGTERM only set `requested`; the loop checkpoints and stops at the next
    optimizer step. A second Ctrl-C raises KeyboardInterrupt at once. Off-main-thread: no-op."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


# --------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------

def forward_loss(model, batch: dict, config: TrainConfig, mask_id: int) -> tuple[torch.Tensor, dict]:
    """The loss to backpropagate and its logged parts for one micro-batch (B, T)."""
    from mars_core import mars_loss
    from mars_core.loss import shifted_ce

    if config.stage == "ar":
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
        loss = shifted_ce(logits, batch["labels"])
        return loss, {"loss": loss.detach()}
    out = mars_loss(model, batch["input_ids"], batch["labels"], batch["attention_mask"],
                    block_size=config.block_size, mask_token_id=mask_id, ar_weight=config.ar_weight)
    return out.total, {"loss": out.total.detach(), "noisy": out.noisy.detach(), "clean": out.clean.detach()}


class Run:
    """One training session: the prepared objects plus the loop, logging and checkpoints."""

    def __init__(self, accelerator, config, model, tokenizer, optimizer, scheduler, loader, sampler,
                 total_steps, state):
        self.acc, self.config = accelerator, config
        self.model, self.tokenizer = model, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.loader, self.sampler = loader, sampler
        self.total_steps, self.state = total_steps, state
        self.mask_id = tokenizer.mask_token_id
        self.first_batch_sha1 = None
        self.last_saved = state.step
        self.bar = None

    # -- per step bookkeeping -------------------------------------------------
    def reduce_step(self, sums: dict, micro: int, tokens: int, stop: bool) -> tuple[dict, int, bool]:
        """Average the step's loss parts over micro-batches and ranks; sum tokens; OR the stop flags."""
        names = sorted(sums)
        local = torch.tensor([float(sums[n]) / micro for n in names] + [float(tokens), float(stop)],
                             dtype=torch.float64, device=self.acc.device)
        total = self.acc.reduce(local, "sum")
        world = self.acc.num_processes
        parts = {n: total[i].item() / world for i, n in enumerate(names)}
        return parts, int(total[-2].item()), bool(total[-1].item() > 0)

    def record(self, parts: dict, tokens: int, seconds: float) -> None:
        """Fold one step into the log window; write a record every --log-every steps."""
        window = self.state.window
        for name, value in parts.items():
            window[name] = window.get(name, 0.0) + value
        window["steps"] = window.get("steps", 0) + 1
        window["tokens"] = window.get("tokens", 0) + tokens
        window["seconds"] = window.get("seconds", 0.0) + seconds
        lr = self.scheduler.get_last_lr()[0]
        if self.bar is not None:
            self.bar.update(1)
            shown = {k: f"{v:.3f}" for k, v in parts.items()}
            self.bar.set_postfix(**shown, lr=f"{lr:.2e}", tok_s=f"{tokens / max(seconds, 1e-9):.0f}")
        if self.state.step % self.config.log_every and self.state.step != self.total_steps:
            return
        n = window.pop("steps")
        progress = self.state.epoch + self.state.batch_in_epoch / len(self.loader)  # epochs done, fractional
        record = {"step": self.state.step, "epoch": round(progress, 4), "lr": lr}
        record.update({k: window.pop(k) / n for k in list(window) if k not in ("tokens", "seconds")})
        record["tokens_per_s"] = window.pop("tokens") / max(window.pop("seconds"), 1e-9)
        self.state.window = {}
        if self.acc.is_main_process:
            with open(os.path.join(self.config.output, LOG_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def checkpoint(self) -> None:
        """Save unless this step is already saved."""
        if self.state.step == self.last_saved and list_checkpoints(self.config.output):
            return
        save_checkpoint(self.acc, self.config, self.state)  # its time is not counted in `seconds`
        self.last_saved = self.state.step

    # -- the loop -----------------------------------------------------------------
    def micro_step(self, batch: dict) -> dict:
        """Forward/backward of one micro-batch; the optimizer steps when accelerate syncs."""
        if self.first_batch_sha1 is None:
            self.first_batch_sha1 = hashlib.sha1(batch["input_ids"].cpu().numpy().tobytes()).hexdigest()
        with self.acc.accumulate(self.model):
            loss, parts = forward_loss(self.model, batch, self.config, self.mask_id)
            self.acc.backward(loss)
            if self.acc.sync_gradients and self.config.max_grad_norm > 0:
                self.acc.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            if self.acc.sync_gradients:
                self.scheduler.step()
            self.optimizer.zero_grad()
        return parts

    def epoch_batches(self):
        """This rank's micro-batches for the current epoch, past those already consumed."""
        # accelerate's loader re-sets its sampler's epoch to its own iteration counter on every
        # pass (and a skip_first_batches copy inherits that counter): set both, before copying
        self.loader.set_epoch(self.state.epoch)
        self.sampler.set_epoch(self.state.epoch)
        skip = self.state.batch_in_epoch
        return self.acc.skip_first_batches(self.loader, skip) if skip else self.loader

    def run(self, stop: StopSignal) -> str:
        """Train until the last step, --stop-at, or a signal. Returns the status."""
        sums, micro, tokens, started = {}, 0, 0, time.perf_counter()
        while self.state.step < self.total_steps:
            for batch in self.epoch_batches():
                parts = self.micro_step(batch)
                for name, value in parts.items():
                    sums[name] = sums.get(name, 0.0) + value
                micro += 1
                tokens = tokens + batch["attention_mask"].sum()  # a tensor: no device sync per micro-batch
                self.state.batch_in_epoch += 1
                if not self.acc.sync_gradients:
                    continue
                status = self.after_step(sums, micro, tokens, time.perf_counter() - started, stop)
                sums, micro, tokens, started = {}, 0, 0, time.perf_counter()
                if status:
                    return status
            # after_step has already moved the position past the finished epoch: the last
            # batch of an epoch always ends an optimizer step (accelerate syncs at the end)
        return "finished"

    def after_step(self, sums, micro, tokens, seconds, stop: StopSignal) -> str | None:
        """Bookkeeping after an optimizer step; a status when the loop must end."""
        if self.state.batch_in_epoch >= len(self.loader):  # the epoch is used up: point past it
            self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
        self.state.step += 1
        parts, tokens, stop_now = self.reduce_step(sums, micro, tokens, stop.requested)
        self.state.tokens += tokens
        self.state.seconds += seconds
        self.record(parts, tokens, seconds)
        status = None
        if self.state.step >= self.total_steps:
            status = "finished"
        elif stop_now:
            status = "interrupted"
        elif self.config.stop_at is not None and self.state.step >= self.config.stop_at:
            status = "stopped"
        every = self.config.save_every
        if status or (every and self.state.step % every == 0):
            self.checkpoint()
        return status


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------

def resolve_mixed_precision(choice: str) -> str:
    """auto: what `accelerate launch` was configured with, else bf16 where the GPU has it, else no."""
    if choice != "auto":
        return choice
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if launcher:
        return launcher
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def make_accelerator(config: TrainConfig):
    from accelerate import Accelerator

    # cpu=True on a machine without CUDA: otherwise accelerate ignores torchrun's ranks there and
    # every process trains alone instead of joining a gloo process group.
    return Accelerator(cpu=not torch.cuda.is_available(),
                       mixed_precision=resolve_mixed_precision(config.mixed_precision),
                       gradient_accumulation_steps=config.grad_accum,
                       step_scheduler_with_optimizer=False)


def peak_memory_mb(accelerator) -> float:
    """Peak memory of the busiest rank: CUDA allocations on a GPU, max RSS on a CPU."""
    if accelerator.device.type == "cuda":
        local = torch.cuda.max_memory_allocated(accelerator.device) / 2**20
    else:
        local = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    value = torch.tensor([local], dtype=torch.float64, device=accelerator.device)
    return float(accelerator.reduce(value, "max").item())


def setup(accelerator, config: TrainConfig):
    """Model, data, optimizer and schedule, prepared by accelerate; also the total step count."""
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import get_cosine_schedule_with_warmup

    set_seed(config.seed)  # identical initial weights on every rank
    model, tokenizer = load_model_and_tokenizer(config)
    dataset, data_info = load_training_data(config, tokenizer)
    sampler = LengthGroupedBatchSampler(dataset.lengths, config.batch_size, config.seed)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=Collator(tokenizer.pad_token_id))
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.learning_rate)
    if accelerator.state.deepspeed_plugin is not None:  # it cannot read a batch size off a batch sampler
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = config.batch_size
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if len(loader) == 0:
        raise ValueError(f"{len(dataset)} examples give no full batch of {config.batch_size} "
                         f"for each of {accelerator.num_processes} processes")
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum)
    total = config.max_steps or steps_per_epoch * (config.epochs or 1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, math.ceil(config.warmup_ratio * total), total)
    scheduler = accelerator.prepare(scheduler)
    return model, tokenizer, optimizer, scheduler, loader, sampler, total, data_info


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


def say(accelerator, config: TrainConfig, message: str) -> None:
    """A console line from the main process (the CLI's only output besides the progress bar)."""
    if accelerator.is_main_process and not config.quiet:
        from tqdm.auto import tqdm

        tqdm.write(message)


def release(accelerator) -> None:
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
