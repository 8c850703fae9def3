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

from .lookup import LookupPolicy


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
    """Lossless MARS that drafts by prompt lookup where the text repeats, by its masks elsewhere
    (`lookup.LookupPolicy`, the one rule). Before each forward after the first, every row asks
    the policy; one chain either way; greedy only. A row whose drafts were copied keeps the mask
    drafts of that forward only where the policy says so; where no row keeps any, the forward
    carries no group (`needs_groups`) and is B - 1 tokens narrower."""

    def __init__(self, prompts: list[list[int]], n_masks: int, policy: LookupPolicy):
        self.policy = policy
        super().__init__(len(prompts), max(n_masks, policy.tokens))
        self.texts = [list(p) for p in prompts]
        self.started = False  # the first forward drafts nothing, as SelfDrafter's (rows only ever leave)
        self.copied = [False] * len(prompts)  # per active row: did its last proposal copy?

    def propose(self) -> tuple[list[list[int]], torch.Tensor | None]:
        if not self.started:
            return self.drafts, None
        picks = [self.policy.propose(text, masks) for text, masks in zip(self.texts, self.drafts)]
        self.copied = [c for _, c in picks]
        return [d for d, _ in picks], None

    @property
    def needs_groups(self) -> bool:
        """Whether the next forward must carry mask groups: not if every row's drafts are copied
        and the policy drops the masks after a copied chain."""
        return self.policy.masks_after_copy or not (self.started and all(self.copied))

    def update(self, j: list[int], emitted: list[list[int]], drafts: list[list[int]], q: torch.Tensor | None) -> None:
        for text, e in zip(self.texts, emitted):
            text.extend(e)
        self.started = True
        drafts = [self.policy.masks_after(d, c) for d, c in zip(drafts, self.copied)]
        super().update(j, emitted, drafts, q)

    def select(self, keep: list[int]) -> None:
        self.texts = [self.texts[i] for i in keep]
        self.copied = [self.copied[i] for i in keep]
        super().select(keep)
