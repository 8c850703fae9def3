"""The MARS loss for a model whose lower layers are frozen: their output is computed once and reused.

On a 2-core CPU a full MARS step of the 135M model costs 7 s for a 320-token example, and a
forward alone 1.9 s (docs/smollm2.md). Training only the top `k` decoder layers, the lower layers
see the same input every epoch (the noisy copy is deterministic: every response token is the
mask), so their output is a constant of the example. Two more savings, both exact:

- compact layout: a noisy position outside the blocks that hold the response is attended by
  nothing that carries a loss (noisy -> noisy stays inside a block, clean never sees noisy), so
  the noisy half starts at the block of the last prompt token;
- logits only at the positions that predict a response token (the head is 49,152 wide).

`compact_inputs` + `lower_hidden` + `upper_loss` equal `mars_loss` on the full `[noisy | clean]`
layout (tests/test_frozen_layers.py checks it against that oracle).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from mars_core.masks import mars_training_mask


class Compact(NamedTuple):
    ids: torch.Tensor  # (1, m) noisy blocks that hold the response, then the clean sequence
    pos: torch.Tensor  # (1, m) logical positions
    mask: torch.Tensor  # (1, 1, m, m) bool, True = may attend
    noisy_q: torch.Tensor  # (r,) indices into m of the noisy queries that predict the response
    clean_q: torch.Tensor  # (r,) the same for the clean half
    targets: torch.Tensor  # (r,) the response token ids (EOS included when the answer ended)
    distance: torch.Tensor  # (r,) per noisy query: its target's distance past the last real token it sees


def compact_inputs(ids: list[int], start: int, block_size: int, mask_id: int) -> Compact:
    """The compact MARS layout of one example: `ids` = prompt + response, response from `start`.

    Full layout positions: noisy p -> p, clean p -> n + p. Kept: noisy p >= s0, the first position
    of the block of `start - 1` (the last prompt token, whose logit predicts the first response
    token), and every clean position."""
    n = len(ids)
    if not 1 <= start < n:
        raise ValueError(f"the response must start inside the sequence (1 <= start < {n}), got {start}")
    s0 = (start - 1) // block_size * block_size
    x = torch.tensor(ids)
    noisy = x.clone()
    noisy[start:] = mask_id
    keep = torch.cat([torch.arange(s0, n), torch.arange(n, 2 * n)])
    full = mars_training_mask(n, block_size)  # (2n, 2n)
    mask = full[keep][:, keep]
    q = torch.arange(start - 1, n - 1)  # positions whose logit predicts a response token
    # A noisy query sees real tokens up to the last prompt token when they share its block, else up
    # to the end of the previous block (every response token is a mask in the noisy half).
    last_real = torch.where(q < start, q, torch.where(q // block_size == (start - 1) // block_size,
                                                       start - 1, q // block_size * block_size - 1))
    return Compact(
        ids=torch.cat([noisy[s0:], x])[None],
        pos=torch.cat([torch.arange(s0, n), torch.arange(n)])[None],
        mask=mask[None, None],
        noisy_q=q - s0,
        clean_q=(n - s0) + q,
        targets=x[start:],
        distance=q + 1 - last_real,
    )


def _rope_and_mask(model, hidden: torch.Tensor, c: Compact):
    inner = model.model
    return inner.rotary_emb(hidden, position_ids=c.pos), c.mask


def run_layers(model, hidden: torch.Tensor, c: Compact, layers) -> torch.Tensor:
    """`hidden` through `layers` (a slice of the decoder's layers), as the model's own forward
    runs them under sdpa with a 4-D boolean mask (used as given)."""
    rope, mask = _rope_and_mask(model, hidden, c)
    for layer in layers:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=rope, position_ids=c.pos)
    return hidden


def lower_hidden(model, c: Compact, split: int) -> torch.Tensor:
    """The output of the first `split` decoder layers, (1, m, H), without autograd."""
    with torch.no_grad():
        hidden = model.model.embed_tokens(c.ids)
        return run_layers(model, hidden, c, model.model.layers[:split])


def upper_loss(model, hidden: torch.Tensor, c: Compact, split: int,
               max_distance: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(noisy CE, clean CE), token means over the response, from the lower layers' output.

    `max_distance` (None: every target, as the paper's code) keeps only the noisy targets at most
    that far past the last real token. Decoding with block size B reads distances 1..B; the
    paper's loss also trains each block's last mask on the next block's first token, B + 1 away,
    a prediction inference never reads and the hardest one in the block."""
    hidden = run_layers(model, hidden, c, model.model.layers[split:])
    rows = torch.cat([c.noisy_q, c.clean_q])
    logits = model.lm_head(model.model.norm(hidden[0, rows])).float()  # (2r, V)
    r = len(c.targets)
    if max_distance is None:
        noisy = F.cross_entropy(logits[:r], c.targets)
    else:
        keep = c.distance <= max_distance
        noisy = F.cross_entropy(logits[:r][keep], c.targets[keep])
    clean = F.cross_entropy(logits[r:], c.targets)
    return noisy, clean


def trainable_upper(model, split: int) -> list[torch.nn.Parameter]:
    """Freeze everything but decoder layers `split:`; return their parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for layer in model.model.layers[split:] for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    return params
