"""The MARS training loss: L = CE_noisy + ar_weight * CE_clean, from ONE forward of [noisy | clean]."""
from __future__ import annotations

from typing import NamedTuple, TYPE_CHECKING

import torch
import torch.nn.functional as F

from .masks import for_model, mars_training_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

IGNORE = -100


class MarsLoss(NamedTuple):
    total: torch.Tensor  # noisy + ar_weight * clean, what to backpropagate
    noisy: torch.Tensor  # CE of the noisy half: predictions made from [MASK] blocks
    clean: torch.Tensor  # CE of the clean half: the ordinary AR (SFT) loss


def shifted_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token CE: the logit at t predicts labels[t + 1], as in the model's AR head.

    logits: (N, n, V); labels: (N, n) with IGNORE where no loss is taken. A batch with no
    label at all gives 0 (not NaN) so gradient accumulation over such a batch is harmless.
    """
    pred = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    target = labels[:, 1:].reshape(-1)
    if (target != IGNORE).sum() == 0:
        return pred.sum() * 0.0
    return F.cross_entropy(pred, target, ignore_index=IGNORE)


def mars_inputs(input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor, block_size: int,
                mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build the `[noisy | clean]` forward inputs for a right-padded batch.

    input_ids, labels, attention_mask: (N, n); labels hold the token ids on response tokens and
    IGNORE elsewhere (prompt, padding). Returns ids (N, 2n), a boolean 4-D mask (N, 1, 2n, 2n)
    and position ids (N, 2n) = 0..n-1 twice.
    """
    n = input_ids.shape[1]
    response = labels != IGNORE
    noisy = torch.where(response, torch.full_like(input_ids, mask_token_id), input_ids)
    ids = torch.cat([noisy, input_ids], dim=1)  # (N, 2n)
    valid = attention_mask.bool()
    key_valid = torch.cat([valid, valid], dim=1)  # padding is never attended
    base = mars_training_mask(n, block_size, device=input_ids.device)  # (2n, 2n)
    mask = (base[None] & key_valid[:, None, :])[:, None]  # (N, 1, 2n, 2n)
    pos = torch.arange(n, device=input_ids.device).repeat(2)[None].expand(input_ids.shape[0], -1)
    return ids, mask, pos


def mars_loss(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    block_size: int,
    mask_token_id: int,
    ar_weight: float = 1.0,
) -> MarsLoss:
    """One MARS training forward. `ar_weight = 0` is the paper's "MARS w/o SFT loss" ablation.

    input_ids, labels, attention_mask: (N, n), right padded; labels = IGNORE on prompt and
    padding. Works under sdpa and eager attention (the mask is given in the form each applies);
    other attention implementations raise a ValueError.
    """
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and labels {tuple(labels.shape)} differ")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if ar_weight < 0:
        raise ValueError(f"ar_weight must be >= 0, got {ar_weight}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    n = input_ids.shape[1]
    ids, mask, pos = mars_inputs(input_ids, labels, attention_mask, block_size, mask_token_id)
    mask = for_model(mask, model)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits  # (N, 2n, V)
    noisy = shifted_ce(logits[:, :n], labels)
    clean = shifted_ce(logits[:, n:], labels)
    return MarsLoss(noisy + ar_weight * clean, noisy, clean)
