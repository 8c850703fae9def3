"""The public entry points: `generate` (a batch, to completion) and `stream` (one prompt, step by step)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, TYPE_CHECKING

from .config import DecodeConfig, TauControl, check_tau
from .decode_block import decode_block
from .decode_compiled import decode_compiled
from .decode_sliding import decode_sliding
from .decoders import AR_MARS, CORE, Decoder, plain, start
from .decoding import DecodeStats, Rows, StepEvent
from .prompts import check_prompts, encode_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _block(model, rows: Rows, mask_id: int, pad_id: int, draft_model=None) -> Iterator[StepEvent]:
    return decode_block(model, rows, mask_id, pad_id, rows.cfg.cache_block_size)


# Every decoder, with its role: the references are the oracles the production paths are tested
# against token for token (tests/test_decoders.py, test_exact.py); `CORE` is what a Hub folder carries.
DECODERS: tuple[Decoder, ...] = CORE + (
    Decoder("sliding", "production", AR_MARS, "sliding", False, plain(decode_sliding),
            "a KV cache of the committed prefix, cropped after each step: batch 1's eager fast path"),
    Decoder("block", "production", AR_MARS, "block", False, _block,
            "the paper's block-level cache: rows of a batch wait for each other at block boundaries"),
    Decoder("compiled", "production", AR_MARS, "cursor", True, plain(decode_compiled),
            "the cursor cache with static shapes, one torch.compile graph per batch bucket and window"),
)


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
    return start(model, tokenizer, prompt_ids, config, control, draft_model, DECODERS)


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
