"""KV-cache helpers the batched decoders share: the prompt prefill and dropping finished rows."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .decoding import Rows, left_pad, positions
from .masks import causal_mask


@torch.no_grad()
def prefill(model, rows: Rows, pad_id: int):
    """Cache every prompt token but the last. Returns (cache, key_valid (N, L), n_real (N,))."""
    ids, valid = left_pad([p[:-1] for p in rows.prompts], pad_id, rows.device)
    cache = DynamicCache(config=model.config)
    if ids.shape[1] > 0:
        model(input_ids=ids, attention_mask=causal_mask(valid, ids.shape[1]),
              position_ids=positions(valid), cache=cache, use_cache=True, logits_to_keep=1)
        rows.stats.prefill_forwards += 1
    return cache, valid, valid.sum(dim=1)


def select(keep: list[int], cache, *tensors):
    """Keep only the batch rows `keep` of the cache and of each tensor (no copy if all stay)."""
    if len(keep) == tensors[0].shape[0]:
        return tensors
    idx = torch.tensor(keep, dtype=torch.long, device=tensors[0].device)
    cache.batch_select_indices(idx)
    return tuple(t[idx] for t in tensors)
