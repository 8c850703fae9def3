"""Who proposes the drafts an exact step verifies: the `Drafter` protocol and lossless MARS's own.

A drafter is asked for drafts before every forward of `decode_exact` and told afterwards what the
verification kept, as transformers' `CandidateGenerator` is (`get_candidates` /
`update_candidate_strategy`). Four implement it: `SelfDrafter` (lossless MARS: the previous
forward's mask predictions), `LookupDrafter` (those, or prompt-lookup drafts where the text
repeats), `speculative.ModelDrafter` (a draft model, mode "spec") and the tests' scripted
drafters.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .lookup import lookup_match


@runtime_checkable
class Drafter(Protocol):
    K: int  # the most drafts it proposes per row and step

    def propose(self) -> tuple[list[list[int]], torch.Tensor | None]:
        """Per active row, up to K draft ids; and the distributions q (R, K, V) they were drawn
        from (sampling), None when greedy."""
        ...

    def update(self, j: list[int], emitted: list[list[int]], drafts: list[list[int]],
               q: torch.Tensor | None) -> None:
        """After the verification: row i accepted j[i] drafts and emitted `emitted[i]` (the
        accepted drafts first); `drafts` / `q` are the step's own mask predictions after them,
        the next drafts of a self-drafting model (empty where the forward had no such group)."""
        ...

    def select(self, keep: list[int]) -> None:
        """Keep only the rows `keep` (indices into the active rows), in that order."""
        ...


class SelfDrafter:
    """Lossless MARS: the drafts are the previous forward's mask predictions (group j)."""

    def __init__(self, n_rows: int, K: int):
        self.K = K
        self.drafts: list[list[int]] = [[] for _ in range(n_rows)]  # none before the first forward
        self.q: torch.Tensor | None = None  # (R, K, V) their distributions (sampling)

    def propose(self) -> tuple[list[list[int]], torch.Tensor | None]:
        return self.drafts, self.q

    def update(self, j: list[int], emitted: list[list[int]], drafts: list[list[int]], q: torch.Tensor | None) -> None:
        self.drafts, self.q = drafts, q

    def select(self, keep: list[int]) -> None:
        self.drafts = [self.drafts[i] for i in keep]
        if self.q is not None:
            self.q = self.q[torch.tensor(keep, dtype=torch.long, device=self.q.device)]


class LookupDrafter(SelfDrafter):
    """Lossless MARS that drafts by prompt lookup where the text repeats, by its masks elsewhere.

    Before each forward after the first, a row whose last `min_ngram`-gram (or a longer one, up
    to 3) occurred earlier in its prompt or output proposes the up to `n_lookup` tokens that
    followed it (`lookup.lookup_match`); any other row proposes its B - 1 mask predictions. One
    chain either way; greedy only.

    With the "last" layout (`groups_after_copy` False), a forward whose drafts a row copied
    carries no mask group for that row: the mask predictions after a copied chain are dropped
    (`update`), so a next step without a lookup match has no drafts, emits one AR token and drafts
    again; where every row copied, the forward is B - 1 tokens narrower (`needs_groups`). "last"'s
    one group stands after the last copied draft, and replayed on the real model dropping it left
    tokens per forward unchanged to two decimals on three sets; with "all" the groups after a
    partial accept add 0.04-0.06, so they stay (docs/cpu-kernels.md).
    """

    def __init__(self, prompts: list[list[int]], n_masks: int, min_ngram: int, n_lookup: int | None = None,
                 groups_after_copy: bool = True):
        self.n_lookup = n_masks if n_lookup is None else n_lookup
        super().__init__(len(prompts), max(n_masks, self.n_lookup))
        self.texts = [list(p) for p in prompts]
        self.started = False  # the first forward drafts nothing, as SelfDrafter's (rows only ever leave)
        self.min_ngram = min_ngram
        self.copied = [False] * len(prompts)  # per active row: did its last proposal copy?
        self.groups_after_copy = groups_after_copy

    def propose(self) -> tuple[list[list[int]], torch.Tensor | None]:
        if not self.started:
            return self.drafts, None
        picks = [pick(text, masks, self.min_ngram, self.n_lookup) for text, masks in zip(self.texts, self.drafts)]
        self.copied = [c for _, c in picks]
        return [d for d, _ in picks], None

    @property
    def needs_groups(self) -> bool:
        """Whether the next forward must carry mask groups: not if every row's drafts are copied
        (and the masks after a copied chain are dropped)."""
        return self.groups_after_copy or not (self.started and all(self.copied))

    def update(self, j: list[int], emitted: list[list[int]], drafts: list[list[int]], q: torch.Tensor | None) -> None:
        for text, e in zip(self.texts, emitted):
            text.extend(e)
        self.started = True
        if not self.groups_after_copy:
            drafts = [[] if c else d for d, c in zip(drafts, self.copied)]
        super().update(j, emitted, drafts, q)

    def select(self, keep: list[int]) -> None:
        self.texts = [self.texts[i] for i in keep]
        self.copied = [self.copied[i] for i in keep]
        super().select(keep)


def pick(text: list[int], masks: list[int], min_ngram: int, n_lookup: int) -> tuple[list[int], bool]:
    """A row's drafts under prompt lookup and whether they were copied: up to `n_lookup` tokens
    from after an earlier occurrence of the text's last n-gram (n >= min_ngram), else its mask
    predictions `masks`."""
    n, copied = lookup_match(text, n_lookup)
    return (copied, True) if n >= min_ngram and copied else (masks, False)
