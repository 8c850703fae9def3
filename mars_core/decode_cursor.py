"""MARS (and AR, block size 1) with a cursor-based KV cache: no block-boundary synchronisation.

The paper's future work (spec section 4). Every sequence owns a row of a preallocated key/value
buffer per layer, shape (N, kv_heads, capacity, head_dim), and a write cursor `c`: slots
[0, c) of its row hold the key/values of its committed tokens, at slot = position id (the
prompt starts at slot 0, so there is no padding and there are no holes). One step forwards,
for every sequence, the real tokens it has not cached yet (the tokens it accepted last step; the
whole prompt at the first step) followed by B - 1 [MASK] tokens, written at its own
[c, c + W). Rows with fewer new tokens are padded at the right end; those slots are beyond
the row's causal horizon, so nothing reads them. After the forward the cursor advances by the
number of REAL tokens only, so the mask (and padding) slots are simply overwritten next step:
no crop, no copy, no concatenation, no idling at block boundaries.

    row 0 (accepted 3)  | committed ...... c0 | t t t M M M | . .       W = 3 + B - 1 = 6
    row 1 (accepted 1)  | committed .. c1 | t M M M p p | . . . . .   p: padding, never read
                                            ^ writes at [c_i, c_i + W)
    next step: c0 += 3, c1 += 1; the M / p slots are overwritten.

Attention: query j of row i sits at position c_i + j and may see slots k <= c_i + j, which is
exactly its committed prefix plus the new tokens before it; the mask is one comparison of a
slot range against the positions, (R, 1, W, L) with L = max_i c_i + W (the buffer is sliced to
L, a view). The predictions of row i are read at columns k_i - 1 .. k_i + B - 2 (its last real
token and its masks) with a 2-D integer `logits_to_keep`.

The first step forwards the whole prompt plus the masks (no separate prefill forward). The
buffer is zero-filled so that never-written slots, which are always masked out, cannot carry
NaN into the attention. Sequences that finish are dropped from the batch (one row gather of the
buffers per finishing event, not per step).
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch
from transformers.cache_utils import Cache

from .decoding import Rows, StepEvent

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class CursorCache(Cache):
    """A preallocated KV buffer per layer with one write cursor per batch row.

    `plan(start, slots, length)` is called before every forward: the layers then write their new
    key/values for row i at slots[i] = [start_i, start_i + width) and attend over [0, length).
    The caller's 4-D attention mask decides which of those slots each query sees.
    """

    is_compileable = False

    def __init__(self, batch: int, capacity: int):
        super().__init__(layers=[])
        self.batch = batch
        self.capacity = capacity
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._start = 0  # int (every row writes at the same slot) or (R, H, W, D) scatter index
        self._width = 0
        self._length = 0

    def plan(self, start: list[int], slots: torch.Tensor, length: int) -> None:
        """start: the rows' cursors (host ints); slots: (R, W) long, start_i + 0..W-1."""
        width = slots.shape[1]
        if max(start) + width > self.capacity:
            raise RuntimeError(f"cursor cache overflow: {max(start) + width} > {self.capacity} slots")
        self._width, self._length = width, length
        # every row at the same cursor (batch 1, the first step): a slice assignment, no scatter
        self._start = start[0] if min(start) == max(start) else slots

    def _alloc(self, key_states, value_states):
        _, H, _, D = key_states.shape
        shape = (self.batch, H, self.capacity, D)
        self.keys.append(torch.zeros(shape, dtype=key_states.dtype, device=key_states.device))
        self.values.append(torch.zeros((self.batch, H, self.capacity, value_states.shape[-1]),
                                       dtype=value_states.dtype, device=value_states.device))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a layer's new key/values (R, H, W, D) at the planned slots; return its keys and
        values over the attended slots, (R, H, L, D) each (views of the buffers)."""
        if layer_idx == len(self.keys):
            self._alloc(key_states, value_states)
        R = key_states.shape[0]  # the forward's rows are the buffer's first R rows
        k, v = self.keys[layer_idx][:R], self.values[layer_idx][:R]
        if isinstance(self._start, int):
            s = self._start
            k[:, :, s:s + self._width] = key_states
            v[:, :, s:s + self._width] = value_states
        else:
            _, H, W, D = key_states.shape
            if self._start.dim() == 2:  # first layer of this forward: expand once
                self._start = self._start[:, None, :, None].expand(R, H, W, D)
            k.scatter_(2, self._start, key_states)
            v.scatter_(2, self._start.expand(R, H, W, value_states.shape[-1]), value_states)
        return k[:, :, : self._length], v[:, :, : self._length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` slots of row `src` into row `dst` (a continuous batch keeps its
        running rows at the top of the buffer by moving the last one into a freed row)."""
        for buf in self.keys + self.values:
            buf[dst, :, :length] = buf[src, :, :length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]
        self.batch = int(indices.shape[0])

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a cursor cache is never cropped: move the cursors instead")

    def reset(self) -> None:
        self.keys, self.values = [], []


def cursor_forward(model: PreTrainedModel, cache: CursorCache, feed: list[list[int]], cursor: list[int],
                   predictions: int, mask_id: int, pad_id: int) -> torch.Tensor:
    """One forward of R rows at their own cursors; returns the logits (R, predictions, V).

    Row i feeds its uncached real tokens `feed[i]` and `predictions - 1` masks at slots
    [cursor[i], cursor[i] + W); the predictions are read from its last real token and its masks.
    The caller advances each cursor by len(feed[i]) afterwards (the masks are overwritten).
    """
    dev = next(model.parameters()).device
    masks = [mask_id] * (predictions - 1)
    k = [len(f) for f in feed]
    W = max(k) + predictions - 1
    ids = torch.tensor([f + masks + [pad_id] * (W - n - predictions + 1) for f, n in zip(feed, k)], device=dev)
    start = torch.tensor(cursor, device=dev)
    pos = start[:, None] + torch.arange(W, device=dev)  # (R, W)
    L = max(cursor) + W
    visible = torch.arange(L, device=dev)[None, None, :] <= pos[:, :, None]  # (R, W, L)
    cache.plan(cursor, pos, L)
    if min(k) == max(k):  # no padding: the predictions are the last columns of every row
        keep_cols = predictions
    else:
        keep_cols = torch.tensor(k, device=dev)[:, None] - 1 + torch.arange(predictions, device=dev)  # (R, P)
    return model(input_ids=ids, attention_mask=visible[:, None], position_ids=pos, cache=cache,
                 use_cache=True, logits_to_keep=keep_cols).logits


@torch.no_grad()
def decode_cursor(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops; the tokens land in
    `rows.out`. model: a causal LM under sdpa attention; each forward reads logits (R, B, V) for
    the R rows still decoding. mask_id: the [MASK] id; pad_id: fills slots no query attends to."""
    B = rows.block
    dev = rows.device
    longest = max(len(p) for p in rows.prompts)
    cache = CursorCache(len(rows.prompts), longest + rows.cfg.max_new_tokens + 2 * B)
    cursor = [0] * len(rows.prompts)  # cached tokens per row (= next slot = next position id)
    feed = [list(p) for p in rows.prompts]  # real tokens not yet in the cache
    while rows.running():
        tau = rows.tau()
        logits = cursor_forward(model, cache, feed, cursor, B, mask_id, pad_id)  # (R, B, V)
        cursor = [c + len(f) for c, f in zip(cursor, feed)]
        live = rows.active
        tokens, conf, n_acc = rows.accept(logits, live, tau)
        step = rows.commit(live, tokens, conf, n_acc, tau)
        event, feed = step.event, step.taken
        keep = rows.still_active()
        if keep and len(keep) < len(cursor):
            cache.batch_select_indices(torch.tensor(keep, dtype=torch.long, device=dev))
            feed = [feed[i] for i in keep]
            cursor = [cursor[i] for i in keep]
        yield event
