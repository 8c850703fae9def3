"""Prompt lookup: drafts copied from earlier in the text (Saxena 2023; transformers'
`prompt_lookup_num_tokens`). Lossless MARS can take them instead of (or beside) its mask drafts
where the text repeats itself: verification keeps the output exactly the model's AR output.

`LookupPolicy` is the one rule every exact decoder follows (eager chain, compiled chain, drafted
shapes); `benchmarks.tree_bound` replays it with an n-gram search of its own.
"""
from __future__ import annotations

from dataclasses import dataclass


def lookup_match(text: list[int], n_draft: int, max_ngram: int = 3) -> tuple[int, list[int]]:
    """(n, up to n_draft tokens that followed the latest earlier occurrence of the text's last
    n-gram), n from max_ngram down to 1; (0, []) when not even the last token occurred before.

        text  = a b c x a b   ->  the last 2-gram "a b" occurred at 0: (2, [c, x, a]) for n_draft 3
    """
    for n in range(min(max_ngram, len(text) - 1), 0, -1):
        tail = text[-n:]
        for start in range(len(text) - n - 1, -1, -1):
            if text[start:start + n] == tail:
                return n, text[start + n:start + n + n_draft]
    return 0, []


@dataclass(frozen=True)
class LookupPolicy:
    """When a row drafts by prompt lookup, how far, and what its masks do after a copied chain.

    min_ngram: the shortest match (1..3) that drafts; tokens: the most drafts a match proposes
    (the config's `prompt_lookup_tokens`, default block_size - 1 everywhere, the replay included);
    masks_after_copy: whether a forward of copied drafts still carries mask groups. With the
    "last" layout it does not: its one group would stand after the last copied draft, read only
    when all of them are accepted and the next step finds no match (replayed: tokens per forward
    unchanged to two decimals), so such a forward is B - 1 tokens narrower and the next step
    without a match has no mask drafts. With "all" and with trees the groups stay."""

    min_ngram: int
    tokens: int
    masks_after_copy: bool = True

    def __post_init__(self):
        if not 1 <= self.min_ngram <= 3 or self.tokens < 1:
            raise ValueError(f"prompt lookup needs min_ngram 1..3 and tokens >= 1, got {self.min_ngram}, {self.tokens}")

    def propose(self, text: list[int], masks: list[int]) -> tuple[list[int], bool]:
        """A row's drafts and whether they were copied: up to `tokens` tokens from after an
        earlier occurrence of the text's last n-gram (n >= min_ngram), else its mask drafts."""
        n, copied = lookup_match(text, self.tokens)
        return (copied, True) if n >= self.min_ngram and copied else (masks, False)

    def masks_after(self, drafts: list[int], copied: bool) -> list[int]:
        """The mask drafts a row keeps for its next step after a forward whose drafts were
        `copied` (or not)."""
        return drafts if self.masks_after_copy or not copied else []
