"""MARS with the paper's block-level KV cache for batches (spec section 4).

The committed prefix is cached once. Generation then fills one cache block of `B_cache`
positions at a time: every step forwards, for every sequence, only the current block
(its last committed token, the tokens it has accepted inside the block, then [MASK] tokens)
against the cached prefix, and each sequence reads its own B predictions at its own offset
inside the block. A sequence that has filled the block idles until the slowest one has; then
the finished block is written into the cache (merged into the next step's forward, so it costs
no extra forward) and the next block starts. The block's key/values are cropped after every
forward: positions that were [MASK] when computed must never stay in the cache.

A sequence may accept past the block end (up to B - 1 tokens); those carry over to the next
block, so every sequence makes exactly the acceptance decisions it makes alone.
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch

from .decoding import Rows, StepEvent
from .kv import prefill, select
from .masks import causal_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _block_inputs(anchor: list[int], filled: list[list[int]], commit: list[list[int]], Bc: int, B: int,
                  mask_id: int, device: torch.device | str) -> tuple[torch.Tensor, list[int]]:
    """ids (R, W) of [commit segment | anchor, filled tokens, masks] and the column offset of
    each row's first prediction (its last real token)."""
    width = Bc + B - 1
    rows, first = [], []
    for a, f, c in zip(anchor, filled, commit):
        blk = ([a] + f)[:width]
        rows.append(c + blk + [mask_id] * (width - len(blk)))
        first.append(len(c) + min(len(f), Bc - 1))
    return torch.tensor(rows, dtype=torch.long, device=device), first


@torch.no_grad()
def decode_block(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int,
                 cache_block_size: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops; the tokens land in
    `rows.out`. model: a causal LM under sdpa attention; each forward reads logits (R, B, V) for
    the R rows still decoding. mask_id: the [MASK] id; pad_id: fills slots no query attends to.
    cache_block_size: B_cache, the positions of one cache block (>= B)."""
    B, Bc = rows.block, cache_block_size
    cache, kv_valid, n_real = prefill(model, rows, pad_id)
    anchor = [p[-1] for p in rows.prompts]  # last committed token, not in the cache
    filled = [[] for _ in rows.prompts]  # accepted tokens after the anchor, not in the cache
    while rows.running():
        tau = rows.tau()
        commit = [[] for _ in anchor]
        if all(len(f) >= Bc for f in filled):  # the block is full for everyone: write it
            commit = [[a] + f[: Bc - 1] for a, f in zip(anchor, filled)]
            anchor = [f[Bc - 1] for f in filled]
            filled = [f[Bc:] for f in filled]
        ids, first = _block_inputs(anchor, filled, commit, Bc, B, mask_id, rows.device)
        R, width = ids.shape
        key_valid = torch.cat([kv_valid, torch.ones_like(ids, dtype=torch.bool)], dim=1)
        pos = n_real[:, None] + torch.arange(width, device=rows.device)[None]
        keep_cols = torch.tensor(first, device=rows.device)[:, None] + torch.arange(B, device=rows.device)
        out = model(input_ids=ids, attention_mask=causal_mask(key_valid, width), position_ids=pos,
                    cache=cache, use_cache=True, logits_to_keep=keep_cols)  # (R, B, V)
        n_commit = len(commit[0])
        cache.crop(-(width - n_commit))
        kv_valid = key_valid[:, : kv_valid.shape[1] + n_commit]
        n_real = n_real + n_commit
        working = [i for i in range(R) if len(filled[i]) < Bc]
        live = [rows.active[i] for i in working]
        w = torch.tensor(working, device=rows.device)
        tokens, conf, n_acc = rows.accept(out.logits[w], live, tau)
        step = rows.commit(live, tokens, conf, n_acc, tau)
        event = step.event
        for i, ids_i in zip(working, step.taken):
            filled[i] = filled[i] + ids_i
        keep = rows.still_active()
        anchor = [anchor[i] for i in keep]
        filled = [filled[i] for i in keep]
        if keep:
            kv_valid, n_real = select(keep, cache, kv_valid, n_real)
        yield event
