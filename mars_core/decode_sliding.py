"""MARS (and AR, block size 1) with a sliding KV cache of the committed prefix.

The cache holds every committed token but the last one. Each step forwards, per sequence,
the tokens it accepted last step (as real tokens now) plus B - 1 [MASK] tokens against the
cache, reads the B predictions (the first from the last real token), then crops the mask
key/values away: they were computed for [MASK] and must never stay. Only B - 1 masks are
needed because the B-th mask's own prediction is never used and, attention being causal,
it cannot change the others.

Sequences of a batch accept different counts, so the new tokens are left-padded to the
longest; the padding slots stay in the cache as holes that no query attends to. Sequences
that finish are dropped from the batch (and the cache).
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch
from transformers import DynamicCache

from .decoding import Rows, StepEvent, left_pad, positions
from .kv import prefill, select
from .masks import causal_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@torch.no_grad()
def decode_sliding(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops; the tokens land in
    `rows.out`. model: a causal LM under sdpa attention; each forward reads logits (R, B, V) for
    the R rows still decoding. mask_id: the [MASK] id; pad_id: fills slots no query attends to."""
    if len(rows.prompts) == 1:
        yield from decode_sliding_one(model, rows, mask_id)
        return
    B = rows.block
    cache, kv_valid, n_real = prefill(model, rows, pad_id)
    feed = [[p[-1]] for p in rows.prompts]  # real tokens not yet in the cache
    while rows.running():
        tau = rows.tau()
        new_ids, new_valid = left_pad([f + [mask_id] * (B - 1) for f in feed], pad_id, rows.device)
        width = new_ids.shape[1]
        key_valid = torch.cat([kv_valid, new_valid], dim=1)
        out = model(input_ids=new_ids, attention_mask=causal_mask(key_valid, width),
                    position_ids=positions(new_valid, n_real), cache=cache, use_cache=True,
                    logits_to_keep=B)  # (R, B, V): the last real token and the B - 1 masks
        if B > 1:
            cache.crop(-(B - 1))
        kv_valid = key_valid[:, : key_valid.shape[1] - (B - 1)]
        n_real = n_real + torch.tensor([len(f) for f in feed], device=rows.device)
        live = rows.active
        tokens, conf, n_acc = rows.accept(out.logits, live, tau)
        step = rows.commit(live, tokens, conf, n_acc, tau)
        event, feed = step.event, step.taken
        keep = rows.still_active()
        feed = [feed[i] for i in keep]
        if keep:
            kv_valid, n_real = select(keep, cache, kv_valid, n_real)
        yield event


@torch.no_grad()
def decode_sliding_one(model: PreTrainedModel, rows: Rows, mask_id: int) -> Iterator[StepEvent]:
    """The same decode for a single sequence, without the batch bookkeeping.

    One sequence has no padding and no holes: cache slot = position id, so the model's own causal
    mask and positions (from the cache length) are exact, a step is one tensor built from host
    ints plus the forward, and the prompt needs no forward of its own. The batched loop's
    per-step padding, mask and position tensors would dominate a small model's step
    (docs/experiments.md).
    """
    B = rows.block
    cache = DynamicCache(config=model.config)
    feed, masks = list(rows.prompts[0]), [mask_id] * (B - 1)  # the first step forwards the whole prompt
    while rows.running():
        tau = rows.tau()
        out = model(input_ids=torch.tensor([feed + masks], device=rows.device), cache=cache, use_cache=True,
                    logits_to_keep=B)  # (1, B, V)
        if B > 1:
            cache.crop(-(B - 1))
        tokens, conf, n_acc = rows.accept(out.logits, rows.active, tau)
        step = rows.commit(rows.active, tokens, conf, n_acc, tau)
        event, (feed,) = step.event, step.taken
        rows.still_active()
        yield event
