"""One forward that verifies drafts and carries mask groups, with and without a KV cache.

Per sequence, a step forwards its new real tokens (not yet cached), its k drafts d_1..d_k and
k + 1 groups of B - 1 [MASK] tokens. Group g (g = 0..k) stands logically right after d_g (after
the last real token for g = 0): it sees the prefix and d_1..d_g only, is causal inside, is
invisible to every other token, and its position ids continue from d_g. So whatever number j of
drafts the verification accepts, group j holds exactly the mask predictions a plain MARS
forward of prefix + d_1..d_j would make:

    chain  (causal)        group 0          group 1            ...  group k
    t .. t  d1 d2 .. dk  | M M M (after t) | M M M (after d1) | ... | M M M (after dk)

The outputs are, per sequence, p_1..p_{k+1} (the predictions at the last real token and at
d_1..d_k: the verification) and, per group, its B - 1 mask predictions.

Both contexts keep, per sequence, the text the model has "committed" (the real tokens and the
accepted drafts) and expose the same four calls: `forward`, `keep` (the first j drafts of the
last forward become committed), `rollback` (forget the last n committed tokens: a rejected
draft model proposal) and `select` (drop finished rows).

- `NoCacheContext` is the reference: it recomputes everything and builds group g by an ordinary
  causal MARS forward of prefix + d_1..d_g + masks, k + 1 forwards in all. No 4-D group mask is
  involved, so it checks the one-forward layout independently.
- `CursorContext` does it in ONE forward on a `CursorCache`: the window [real | drafts | groups]
  is written at the row's cursor with a 4-D boolean mask; `keep(j)` advances the cursor past the
  real tokens and the j accepted drafts, whose key/values were computed causally and are exact;
  everything after is overwritten by the next step (no crop, no copy). `rollback` moves the
  cursor back.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .decode_cursor import CursorCache
from .decoding import left_pad, positions
from .masks import causal_mask
from .tree import chain, stack_windows

if TYPE_CHECKING:
    from transformers import PreTrainedModel


GROUPS = ("all", "last", "ends")


def group_choice(k: list[int], groups: str) -> list[list[int]]:
    """Per row, the accept counts j whose group of masks the forward carries (one list length).

    "all": every j = 0..k (padded with k); "last": j = k only (every draft accepted); "ends":
    j = 0 and j = k.
    """
    if groups == "last":
        return [[a] for a in k]
    if groups == "ends":
        return [[0, a] for a in k]
    K = max(k)
    return [list(range(a + 1)) + [a] * (K - a) for a in k]


class NoCacheContext:
    """Full recompute every forward; each group is a separate causal forward (the reference)."""

    def __init__(self, model: PreTrainedModel, n_rows: int, mask_id: int, pad_id: int, device: torch.device | str):
        self.model, self.mask_id, self.pad_id, self.device = model, mask_id, pad_id, device
        self.seq: list[list[int]] = [[] for _ in range(n_rows)]
        self.drafts: list[list[int]] = [[] for _ in range(n_rows)]

    def _forward(self, seqs: list[list[int]], B: int) -> torch.Tensor:
        ids, valid = left_pad(seqs, self.pad_id, self.device)
        return self.model(input_ids=ids, attention_mask=causal_mask(valid, ids.shape[1]),
                          position_ids=positions(valid), logits_to_keep=B).logits  # (R, B, V)

    def forward(self, new: list[list[int]], drafts: list[list[int]], B: int,
                groups: str = "all") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append `new` to each row's text. Returns verify (R, K + 1, V): p_1..p_{K+1} with K =
        the longest draft list (rows with fewer drafts repeat their last); masks (R, G, B - 1, V):
        the groups; sel (R, G) long: the accept count each group stands after."""
        self.seq = [s + n for s, n in zip(self.seq, new)]
        self.drafts = drafts
        k = [len(d) for d in drafts]
        K = max(k)
        chain = self._forward([s + d for s, d in zip(self.seq, drafts)], K + 1)[:, -(K + 1):] if K else None
        sel = group_choice(k, groups)
        masks = []
        for h in range(len(sel[0])):
            logits = self._forward([s + d[: c[h]] + [self.mask_id] * (B - 1)
                                    for s, d, c in zip(self.seq, drafts, sel)], B)
            masks.append(logits[:, 1:])
            if h == 0 and chain is None:
                chain = logits[:, :1]
        # p_i for a row with k < K: its own predictions first, then the last one repeated
        idx = torch.tensor([[min(i, a) + K - a for i in range(K + 1)] for a in k], device=self.device)
        verify = chain.gather(1, idx[..., None].expand(-1, -1, chain.shape[-1]))
        R, V = verify.shape[0], verify.shape[-1]
        masks = torch.stack(masks, dim=1) if masks else verify.new_zeros(R, 0, B - 1, V)
        return verify, masks, torch.tensor(sel, dtype=torch.long, device=self.device).reshape(R, len(sel[0]))

    def keep(self, j: list[int]) -> None:
        """The first j[i] drafts of row i's last forward become committed text."""
        self.seq = [s + d[:n] for s, d, n in zip(self.seq, self.drafts, j)]

    def rollback(self, n: list[int]) -> None:
        """Forget the last n[i] committed tokens of row i."""
        self.seq = [s[: len(s) - k] for s, k in zip(self.seq, n)]

    def select(self, keep: list[int]) -> None:
        """Keep only the rows `keep`, in that order."""
        self.seq = [self.seq[i] for i in keep]
        self.drafts = [self.drafts[i] for i in keep]


class CursorContext:
    """The window of every row in one forward on a `CursorCache` (the fast path)."""

    def __init__(self, model: PreTrainedModel, n_rows: int, capacity: int, mask_id: int, pad_id: int,
                 device: torch.device | str):
        self.model, self.mask_id, self.pad_id, self.device = model, mask_id, pad_id, device
        self.cache = CursorCache(n_rows, capacity)
        self.cursor = [0] * n_rows  # committed tokens per row = next slot = next position id

    def forward(self, new: list[list[int]], drafts: list[list[int]], B: int,
                groups: str = "all") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Same contract as `NoCacheContext.forward` (verify (R, K + 1, V), masks (R, G, B - 1, V),
        sel (R, G)), one model call."""
        dev, M = self.device, B - 1
        n_list, k_list = [len(x) for x in new], [len(d) for d in drafts]
        if any(a == 0 and b for a, b in zip(n_list, k_list)):
            raise ValueError("a row with drafts needs a new real token before them (the root)")
        # a row with nothing new (a draft model's row that is done drafting) runs a padding root at
        # its cursor, which does not move: its outputs are not read and its slots are overwritten
        new = [x if x else [self.pad_id] for x in new]
        advance = n_list
        n_list = [max(a, 1) for a in n_list]
        K = max(k_list)
        sel_list = group_choice(k_list, groups)
        G = len(sel_list[0])
        # the window: the new real tokens (all but the last are a causal prefix, the last is the
        # root), the drafts as a chain, a group after node g for each accept count g of `sel`
        shapes = [chain(k, M, tuple(c)) for k, c in zip(k_list, sel_list)]
        pattern, rel_pos = stack_windows(shapes, [a - 1 for a in n_list], dev)  # (R, W, W), (R, W)
        W = pattern.shape[1]
        widths = [a + s.width - 1 for a, s in zip(n_list, shapes)]
        ids = torch.tensor([x + d + [self.mask_id] * (G * M) + [self.pad_id] * (W - w)
                            for x, d, w in zip(new, drafts, widths)], device=dev)
        sel = torch.tensor(sel_list, dtype=torch.long, device=dev).reshape(len(sel_list), G)
        n_, k_ = torch.tensor(n_list, device=dev)[:, None], torch.tensor(k_list, device=dev)[:, None]
        a = torch.minimum(torch.arange(K + 1, device=dev)[None], k_)  # p_1..p_{K+1}, the last repeated
        keep = torch.cat([n_ - 1 + a, n_ + k_ + torch.arange(G * M, device=dev)[None]], dim=1)
        start = torch.tensor(self.cursor, device=dev)
        L = max(self.cursor) + W
        rel = torch.arange(L, device=dev)[None] - start[:, None]  # (R, L) slot - cursor
        in_window = (rel >= 0) & (rel < W)
        window = pattern.gather(2, rel.clamp(0, W - 1)[:, None, :].expand(-1, W, -1))  # (R, W, L)
        visible = (rel < 0)[:, None, :] | (in_window[:, None, :] & window)
        self.cache.plan(self.cursor, start[:, None] + torch.arange(W, device=dev), L)
        logits = self.model(input_ids=ids, attention_mask=visible[:, None], position_ids=start[:, None] + rel_pos,
                            cache=self.cache, use_cache=True, logits_to_keep=keep).logits  # (R, K + 1 + G M, V)
        self.cursor = [c + a for c, a in zip(self.cursor, advance)]
        R, V = logits.shape[0], logits.shape[-1]
        return logits[:, : K + 1], logits[:, K + 1:].reshape(R, G, M, V), sel

    def keep(self, j: list[int]) -> None:
        """Advance each cursor past its j[i] accepted drafts (their key/values are exact)."""
        self.cursor = [c + a for c, a in zip(self.cursor, j)]

    def rollback(self, n: list[int]) -> None:
        """Move each cursor back n[i] tokens; the slots after it are overwritten later."""
        self.cursor = [c - a for c, a in zip(self.cursor, n)]

    def select(self, keep: list[int]) -> None:
        """Keep only the rows `keep`, in that order."""
        if len(keep) < len(self.cursor):
            self.cache.batch_select_indices(torch.tensor(keep, dtype=torch.long, device=self.device))
            self.cursor = [self.cursor[i] for i in keep]
