"""Attention masks: the MARS training mask and the causal masks the decoders pass to the model.

All masks are boolean, True = the query may attend to the key. A stock Hugging Face model under
`attn_implementation="sdpa"` uses a 4-D boolean `attention_mask` of shape (batch, 1, q, k) as is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def mars_training_mask(n: int, block_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The (2n, 2n) MARS training mask for the layout `[noisy | clean]`.

    Both halves carry the logical positions 0..n-1 and `blk(p) = p // block_size`:

      1. clean -> clean: k <= q                      (plain causal)
      2. noisy -> noisy: blk(k) == blk(q), k <= q     (causal inside the block only)
      3. noisy -> clean: blk(k) < blk(q)              (all clean tokens of earlier blocks)
      4. clean -> noisy: never

    n = 8, block_size = 4 (rows are queries, columns keys, # = may attend)::

                    noisy      clean
                  01234567   01234567
        noisy 0   #.......   ........
              1   ##......   ........
              2   ###.....   ........
              3   ####....   ........
              4   ....#...   ####....
              5   ....##..   ####....
              6   ....###.   ####....
              7   ....####   ####....
        clean 0   ........   #.......
              1   ........   ##......
              ...
              7   ........   ########
    """
    if n < 1 or block_size < 1:
        raise ValueError(f"need n >= 1 and block_size >= 1, got n={n}, block_size={block_size}")
    pos = torch.arange(n, device=device)
    blk = pos // block_size
    causal = pos[None, :] <= pos[:, None]  # (n, n) [q, k]
    same_block = blk[None, :] == blk[:, None]
    earlier_block = blk[None, :] < blk[:, None]
    top = torch.cat([causal & same_block, earlier_block], dim=1)  # noisy queries
    bottom = torch.cat([torch.zeros_like(causal), causal], dim=1)  # clean queries
    return torch.cat([top, bottom], dim=0)


def causal_mask(key_valid: torch.Tensor, n_query: int) -> torch.Tensor:
    """(N, 1, q, k) mask for the last `n_query` of `k` keys: causal, and never a padding key.

    key_valid: (N, k) bool, False at padding (or at holes a ragged cache left behind).
    The queries are the last `n_query` keys; query i sits at key index k - n_query + i.
    """
    k = key_valid.shape[1]
    q_idx = torch.arange(k - n_query, k, device=key_valid.device)
    k_idx = torch.arange(k, device=key_valid.device)
    causal = k_idx[None, :] <= q_idx[:, None]  # (q, k)
    return (causal[None] & key_valid[:, None, :])[:, None]  # (N, 1, q, k)


def attention_of(model: PreTrainedModel) -> str:
    """The model's attention implementation ("sdpa", "eager", "flash_attention_2", ...); a
    wrapper such as DistributedDataParallel is looked through."""
    model = getattr(model, "module", model)
    return getattr(model.config, "_attn_implementation", None) or "eager"


def for_model(mask: torch.Tensor, model: PreTrainedModel) -> torch.Tensor:
    """A boolean mask (N, 1, q, k) (True = may attend) in the form `model` applies as written.

    sdpa takes the boolean mask itself. Eager attention *adds* the mask to the scores, so a
    boolean mask would add 0/1 and mask nothing: it gets the additive form (0 where allowed, the
    dtype's minimum where not). Kernels that take no arbitrary mask (flash attention) are refused.
    """
    impl = attention_of(model)
    if impl == "sdpa":
        return mask
    if impl == "eager":
        dtype = next(getattr(model, "module", model).parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    raise ValueError(f"the model's attn_implementation is {impl!r}, which cannot apply MARS's 4-D attention mask; "
                     "load it with attn_implementation=\"sdpa\" (or \"eager\")")


def require_sdpa(model: PreTrainedModel) -> None:
    """The decoders pass boolean masks (a ragged cache's holes, MARS blocks): refuse a model
    that would not apply them as written, instead of decoding wrong tokens silently."""
    impl = attention_of(model)
    if impl != "sdpa":
        raise ValueError(f"the decoders need attn_implementation=\"sdpa\", the model has {impl!r}; "
                         "load it with mars_core.load_model or set_attn_implementation(\"sdpa\")")

