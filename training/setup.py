"""Everything a run needs before its first step: accelerator, model and tokenizer, data, optimizer."""
from __future__ import annotations

import json
import math
import os
import resource
from typing import TYPE_CHECKING

import torch

from training.data import Collator, LengthGroupedBatchSampler, TokenizedDataset, build_dataset, load_records
from training.train_config import PRESET_COMMON, PRESETS, TrainConfig

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config


def qwen2_config(spec: str, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
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


def load_model_and_tokenizer(config: TrainConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """fp32 model (sdpa attention) and tokenizer with a mask token: from --init or from scratch."""
    from mars_core import load_model
    from mars_core.loading import ensure_mask_token, load_tokenizer
    from mars_core.prompts import MASK_TOKEN, context_limit
    from transformers import Qwen2ForCausalLM

    if config.init:  # load_model applies the tokenizer-class policy and adds the mask token
        model, tokenizer = load_model(config.init, dtype=torch.float32, device="cpu")
    else:
        tokenizer = load_tokenizer(config.tokenizer)
        if tokenizer.mask_token is None:  # before sizing the model, so the row exists from the start
            tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        model = Qwen2ForCausalLM(qwen2_config(config.model_config, tokenizer)).float()
        ensure_mask_token(model, tokenizer)
    if model.config._attn_implementation != "sdpa":
        raise ValueError(f"the model uses {model.config._attn_implementation!r} attention; MARS needs 'sdpa'")
    if tokenizer.pad_token is None:  # pads only masked-out slots; any id works
        tokenizer.pad_token = tokenizer.eos_token
    limit = context_limit(model)
    if limit is not None and config.max_length > limit:
        raise ValueError(f"--max-length {config.max_length} exceeds the model's {limit} positions")
    model.config.use_cache = False  # no KV cache while training
    model.train()
    return model, tokenizer


def load_training_data(config: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> tuple[TokenizedDataset, dict]:
    """The tokenised dataset and a description (counts, skips by reason)."""
    records = load_records(config.data, num_examples=config.num_examples, seed=config.data_seed)
    dataset, too_long = build_dataset(tokenizer, records.conversations, config.max_length, config.truncate)
    skipped = dict(records.skipped)
    for reason, count in too_long.items():
        skipped[reason] = skipped.get(reason, 0) + count
    if len(dataset) == 0:
        raise ValueError(f"no usable training examples in {config.data!r} (skipped: {skipped or 'none'})")
    return dataset, {"examples": len(dataset), "skipped": skipped}


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; biases and norm scales are not decayed (standard practice)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def resolve_mixed_precision(choice: str) -> str:
    """auto: what `accelerate launch` was configured with, else bf16 where the GPU has it, else no."""
    if choice != "auto":
        return choice
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if launcher:
        return launcher
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def make_accelerator(config: TrainConfig) -> Accelerator:
    from accelerate import Accelerator

    # cpu=True on a machine without CUDA: otherwise accelerate ignores torchrun's ranks there and
    # every process trains alone instead of joining a gloo process group.
    return Accelerator(cpu=not torch.cuda.is_available(),
                       mixed_precision=resolve_mixed_precision(config.mixed_precision),
                       gradient_accumulation_steps=config.grad_accum,
                       step_scheduler_with_optimizer=False)


def peak_memory_mb(accelerator: Accelerator) -> float:
    """Peak memory of the busiest rank: CUDA allocations on a GPU, max RSS on a CPU."""
    if accelerator.device.type == "cuda":
        local = torch.cuda.max_memory_allocated(accelerator.device) / 2**20
    else:
        local = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    value = torch.tensor([local], dtype=torch.float64, device=accelerator.device)
    return float(accelerator.reduce(value, "max").item())


def setup(accelerator: Accelerator, config: TrainConfig) -> tuple:
    """Model, data, optimizer and schedule, prepared by accelerate; also the total step count:
    (model, tokenizer, optimizer, scheduler, loader, sampler, total_steps, data_info)."""
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
