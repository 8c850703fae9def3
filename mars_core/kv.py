"""KV-cache helpers the batched decoders share: the prompt prefill and dropping finished rows."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import Cache, DynamicCache

from .decoding import Rows, left_pad, positions
from .masks import causal_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@torch.no_grad()
def prefill(model: PreTrainedModel, rows: Rows, pad_id: int) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """Cache every prompt token but the last (left-padded, one forward). Returns (cache,
    key_valid (N, L) bool, n_real (N,) long: cached real tokens per row)."""
    ids, valid = left_pad([p[:-1] for p in rows.prompts], pad_id, rows.device)
    cache = DynamicCache(config=model.config)
    if ids.shape[1] > 0:
        model(input_ids=ids, attention_mask=causal_mask(valid, ids.shape[1]),
              position_ids=positions(valid), cache=cache, use_cache=True, logits_to_keep=1)
        rows.stats.prefill_forwards += 1
    return cache, valid, valid.sum(dim=1)


def select(keep: list[int], cache: Cache, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Keep only the batch rows `keep` of the cache and of each tensor (N, ...) -> (len(keep), ...);
    no copy when every row stays."""
    if len(keep) == tensors[0].shape[0]:
        return tensors
    idx = torch.tensor(keep, dtype=torch.long, device=tensors[0].device)
    cache.batch_select_indices(idx)
    return tuple(t[idx] for t in tensors)
