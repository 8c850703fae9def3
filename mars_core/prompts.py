"""Turning user prompts into token ids, and the special ids a decoder needs."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MASK_TOKEN = "<|mask|>"


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of `prompt`, chat-formatted with the tokenizer's template when it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def check_prompts(prompts: Iterable[str]) -> list[str]:
    """The prompts as a list, or a ValueError naming the first that is not a non-empty string."""
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of strings; wrap a single prompt in a list")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("the prompt list is empty; give at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ValueError(f"prompt {i} is a {type(p).__name__}, not a string")
        if not p.strip():
            raise ValueError(f"prompt {i} is empty")
    return prompts


def special_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, list[int]]:
    """(mask_id, pad_id, stop_ids). The pad id only fills masked-out slots, so any id works."""
    mask_id = tokenizer.mask_token_id
    if mask_id is None:
        mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if mask_id is None or mask_id == tokenizer.unk_token_id:
        raise ValueError(
            f"the tokenizer has no mask token; load the model with mars_core.load_model, which adds {MASK_TOKEN}"
        )
    stop = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if source is None:
            continue
        stop.update(source if isinstance(source, (list, tuple)) else [source])
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = next(iter(stop), 0)
    return mask_id, pad, sorted(stop)


def context_limit(model: PreTrainedModel) -> int | None:
    """The model's number of positions (None when its config does not say)."""
    return getattr(model.config, "max_position_embeddings", None)


def check_context(model: PreTrainedModel, prompt_ids: list[list[int]], max_new_tokens: int, block_size: int) -> None:
    """Raise a ValueError naming the first prompt that cannot decode `max_new_tokens` within the
    model's positions. A MARS step reads `block_size` positions past the committed text, so a
    prompt needs len(prompt) + max_new_tokens + block_size of them (block_size 1 for AR)."""
    limit = context_limit(model)
    for i, ids in enumerate(prompt_ids):
        if not ids:
            raise ValueError(f"prompt {i} encodes to no tokens")
        need = len(ids) + max_new_tokens + block_size
        if limit is not None and need > limit:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} "
                f"it needs {need} positions but the model has {limit}"
            )

