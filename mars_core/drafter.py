"""Who proposes the drafts an exact step verifies: the `Drafter` protocol and lossless MARS's own.

A drafter is asked for drafts before every forward of `decode_exact` and told afterwards what the
verification kept, as transformers' `CandidateGenerator` is (`get_candidates` /
`update_candidate_strategy`). Three implement it: `SelfDrafter` (sampled lossless MARS: the
previous forward's mask predictions), `speculative.ModelDrafter` (a draft model, mode "spec") and
the tests' scripted drafters. Greedy lossless MARS drafts through `draft_plan.Planner` instead,
where every kind of draft (chain, tree, prompt lookup, planned) is a shape of the one exact step.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch



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
