"""The public entry points: `generate` (a batch, to completion) and `stream` (one prompt, step by step)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, TYPE_CHECKING

from .config import DecodeConfig, TauControl, check_tau
from .decode_block import decode_block
from .decode_compiled import decode_compiled
from .decode_cursor import decode_cursor
from .decode_exact import decode_exact
from .decode_reference import decode_reference
from .decode_sliding import decode_sliding
from .decoding import DecodeStats, Rows, StepEvent
from .masks import require_sdpa
from .prompts import check_context, check_prompts, encode_prompt, special_ids
from .speculative import check_draft_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class GenerateResult:
    token_ids: list[list[int]]  # generated ids per prompt, EOS excluded
    texts: list[str]
    confidences: list[list[float]]
    stats: DecodeStats


def decode_steps(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[list[int]], config: DecodeConfig,
                 control: TauControl | None = None, draft_model: PreTrainedModel | None = None) -> tuple[Rows, Iterator[StepEvent]]:
    """Set up a decode of already-tokenised prompts; returns the rows and the step iterator.

    `draft_model` (mode="spec" only): a causal LM with the target's tokenizer that proposes
    `config.draft_tokens` tokens per step.
    """
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if control is None:
        control = TauControl(config.tau, config.metric)
    elif control.metric != config.metric:
        raise ValueError(f"TauControl metric {control.metric!r} differs from config metric {config.metric!r}")
    check_context(model, prompt_ids, config.max_new_tokens, config.lookahead)
    require_sdpa(model)
    mask_id, pad_id, stop_ids = special_ids(model, tokenizer)
    check_draft_model(model, draft_model, tokenizer, config, mask_id)
    if draft_model is not None:
        require_sdpa(draft_model)
    device = next(model.parameters()).device
    rows = Rows(prompt_ids, config, control, stop_ids, device)
    if config.mode in ("lossless", "spec"):
        steps = decode_exact(model, rows, mask_id, pad_id, draft_model)
    elif config.cache == "none":
        steps = decode_reference(model, rows, mask_id, pad_id)
    elif config.cache == "sliding":
        steps = decode_sliding(model, rows, mask_id, pad_id)
    elif config.cache == "cursor" and config.compile:
        steps = decode_compiled(model, rows, mask_id, pad_id)
    elif config.cache == "cursor":
        steps = decode_cursor(model, rows, mask_id, pad_id)
    else:
        steps = decode_block(model, rows, mask_id, pad_id, config.cache_block_size)
    return rows, steps


def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], config: DecodeConfig,
             control: TauControl | None = None, chat: bool = True,
             draft_model: PreTrainedModel | None = None) -> GenerateResult:
    """Decode a batch of prompts to completion. Each row decodes exactly as it would alone.

    `draft_model`: the draft for mode="spec" (a causal LM with the same tokenizer)."""
    prompts = check_prompts(prompts)
    ids = [encode_prompt(tokenizer, p, chat) for p in prompts]
    rows, steps = decode_steps(model, tokenizer, ids, config, control, draft_model)
    for _ in steps:
        pass
    texts = tokenizer.batch_decode(rows.out, skip_special_tokens=True)
    return GenerateResult(rows.out, texts, rows.conf, rows.stats)


def stream(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, config: DecodeConfig,
           control: TauControl | None = None, chat: bool = True,
           draft_model: PreTrainedModel | None = None) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward for a single prompt (index 0 of each field).

    Pass a `TauControl` to change tau (or stop) while the iterator runs.
    """
    check_prompts([prompt])
    if control is not None:
        check_tau(control.tau, config.metric)
    ids = [encode_prompt(tokenizer, prompt, chat)]
    _, steps = decode_steps(model, tokenizer, ids, config, control, draft_model)
    yield from steps
