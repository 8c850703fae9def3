"""What one training run is: `TrainConfig` (validated on construction) and the CLI that builds it."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

STAGES = ("ar", "mars")
MIXED_PRECISION = ("no", "bf16", "auto")
# Learning rates when --lr is not given: the paper's for fine-tuning a pretrained model, and
# one a few-million-parameter model trained from scratch actually learns with.
LR_FINETUNE, LR_SCRATCH = 5e-6, 1e-3
PRESETS = {
    # ~0.2M parameters: tests and smoke runs
    "micro": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2),
    # ~3M parameters: learns the synthetic tasks on a CPU
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
    # ~0.4M parameters: a draft model for "tiny" (speculative decoding); a forward costs about
    # a third of tiny's on a CPU, where per-layer overhead dominates
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1),
}
PRESET_COMMON = dict(tie_word_embeddings=True, max_position_embeddings=512, rms_norm_eps=1e-6)


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
