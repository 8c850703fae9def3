"""Prompt lookup: drafts copied from earlier in the text (Saxena 2023; transformers'
`prompt_lookup_num_tokens`). Lossless MARS can take them instead of its mask drafts where the
text repeats itself: verification keeps the output exactly the model's AR output either way."""
from __future__ import annotations


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
