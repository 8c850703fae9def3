"""The static-shape KV cache and what compiled decoding keeps between decodes.

`StaticCursorCache` writes a forward's key/values at a (R, W) slot tensor with `index_put_` (kept
in place by inductor) and attends over the buffer's first `window` slots, so every shape but the
batch size, the width and the window is fixed; `StaticState` holds one model's key/value layout
and a pool of free buffers (CUDA graphs need fixed addresses); `compiled` makes one
`torch.compile` of a step function per mode; `_bucket` / `_shrink` move the rows still decoding
into a smaller batch bucket. Used by the compiled MARS path (`decode_compiled`) and by the exact
step (`decode_shaped`), eager or compiled.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, TYPE_CHECKING

import torch

from .decode_cursor import CursorCache, cursor_forward

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CAPACITY_STEP = 128  # buffer slots are rounded up to this, so different prompts share graphs
# compiled graphs one process may hold before dynamo falls back to eager (per model, settings,
# batch bucket and window: a batch of 16 needs at most 24 for 256 new tokens, 40 for 2,000);
# dynamo's own default, 8, is too low for one model
RECOMPILE_LIMIT = 128
PREFILL_STEP = 32  # the first step's width is rounded up to this times a batch bucket


class StaticCursorCache(CursorCache):
    """A `CursorCache` whose forwards write at a (R, W) slot tensor and attend over the buffer's
    first `window` slots, so that every shape but the batch size, the width and the window is
    fixed. Its buffers are allocated by `StaticState.take`, before the first forward."""

    is_compileable = True

    def __init__(self, batch: int, capacity: int):
        super().__init__(batch, capacity)
        self.slots: torch.Tensor | None = None  # (R, W) write slots, set around each forward
        self.window = capacity  # a static step attends over the first `window` slots

    def fix_addresses(self) -> None:
        """For CUDA graphs: the buffers are graph inputs mutated in place, so their addresses must
        not change between replays (dynamo then guards on them, hence the pool below)."""
        for t in self.keys + self.values:
            torch._dynamo.mark_static_address(t)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states (R, H, W, D) go to the slots `self.slots` (R, W); returns the
        layer's buffers over the window, (R, H, window, D) views."""
        k, v = self.keys[layer_idx], self.values[layer_idx]
        R, H, W, _ = key_states.shape
        dev = key_states.device
        # index_put_, not scatter_: inductor writes an index_put_ into the buffer in place, but
        # functionalises a scatter_ into a copy of the whole buffer plus a copy back, per layer
        index = (torch.arange(R, device=dev)[:, None, None], torch.arange(H, device=dev)[None, :, None],
                 self.slots[:, None, :])  # (R, 1, 1), (1, H, 1), (R, 1, W): broadcast to (R, H, W)
        k.index_put_(index, key_states)
        v.index_put_(index, value_states)
        return k[:, :, : self.window], v[:, :, : self.window]

_COMPILED: dict[tuple[Callable, str], Callable] = {}
_LOCK = threading.Lock()


def compiled(fn: Callable, mode: str) -> Callable:
    """`fn` (`static_step` or `static_prefill`) under `torch.compile(mode=mode)`, made once per
    function and mode (dynamo keeps one graph per model, settings and shape bucket under it)."""
    with _LOCK:
        if (fn, mode) not in _COMPILED:
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            _COMPILED[fn, mode] = torch.compile(fn, mode=mode, dynamic=False, fullgraph=True)
        return _COMPILED[fn, mode]


def resolve_mode(compile_setting: bool | str, device: torch.device | str) -> str:
    """The torch.compile mode for `DecodeConfig.compile` on `device`."""
    if isinstance(compile_setting, str):
        return compile_setting
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"

class StaticState:
    """One model's key/value layout and its pool of free buffers, kept between decodes.

    One object per model (`static_state`), dropped with the model. (The compiled functions are
    kept per function and mode in `compiled`, not here: dynamo keeps its graphs on the function's
    code, shared by every model, and guards each graph on the model it was traced with.)
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.layout: tuple | None = None  # ((dtype, device) read at, per layer (H, dk, dv, dtype, device))
        self.pool: dict[tuple, list[StaticCursorCache]] = {}  # (batch, capacity, dtype, device) -> free buffers

    def kv_layout(self, model: PreTrainedModel, mask_id: int, pad_id: int) -> list[tuple]:
        """Per layer: (kv_heads, key head_dim, value head_dim, dtype, device) of its cache entries.
        Read from a one-token eager forward into a throwaway cursor cache, so that it holds for any
        architecture (the config's head counts and sizes are named differently, or mean something
        else, from one model family to the next); read again when the model moved or was cast."""
        p = next(model.parameters())
        with self.lock:
            if self.layout is not None and self.layout[0] == (p.dtype, p.device):
                return self.layout[1]
        probe = CursorCache(1, 1)
        cursor_forward(model, probe, [[pad_id]], [0], 1, mask_id, pad_id)
        layout = [(k.shape[1], k.shape[3], v.shape[3], k.dtype, k.device) for k, v in zip(probe.keys, probe.values)]
        with self.lock:
            self.layout = ((p.dtype, p.device), layout)
        return layout

    def take(self, batch: int, capacity: int, layout: list[tuple], graphs: bool = False) -> StaticCursorCache:
        """A free buffer of this shape (zeroed), or a new one allocated from `layout`."""
        with self.lock:
            free = self.pool.setdefault(_pool_key(batch, capacity, *layout[0][3:]), [])
            cache = free.pop() if free else None
        if cache is None:
            cache = StaticCursorCache(batch, capacity)
            for H, dk, dv, dtype, dev in layout:
                cache.keys.append(torch.zeros(batch, H, capacity, dk, dtype=dtype, device=dev))
                cache.values.append(torch.zeros(batch, H, capacity, dv, dtype=dtype, device=dev))
            if graphs:
                cache.fix_addresses()
        else:
            for t in cache.keys + cache.values:
                t.zero_()
        return cache

    def give(self, cache: StaticCursorCache) -> None:
        """Return `cache` to the pool, for the next decode of its shape."""
        with self.lock:
            key = _pool_key(cache.batch, cache.capacity, cache.keys[0].dtype, cache.keys[0].device)
            self.pool.setdefault(key, []).append(cache)

    def release(self) -> None:
        """Drop the pooled buffers."""
        with self.lock:
            self.pool.clear()


_STATES: "weakref.WeakKeyDictionary[torch.nn.Module, StaticState]" = weakref.WeakKeyDictionary()


def static_state(model: PreTrainedModel) -> StaticState:
    """`model`'s `StaticState` (made on first use)."""
    with _LOCK:
        return _STATES.setdefault(model, StaticState())


def _pool_key(batch: int, capacity: int, dtype: torch.dtype, device: torch.device) -> tuple:
    return batch, capacity, dtype, str(device)

def _bucket(n: int) -> int:
    """The smallest batch bucket >= n: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5x
    them: a finished row idles in the batch until the survivors fit a bucket, and powers of two
    alone left many more idle; docs/experiments.md)."""
    p = 1 << (n - 1).bit_length()  # the smallest power of two >= n
    return p * 3 // 4 if p >= 4 and n <= p * 3 // 4 else p

def _shrink(owner: StaticState, cache: StaticCursorCache, state: list[torch.Tensor], order: list[int],
            live: set[int], layout: list[tuple], graphs: bool) -> tuple[StaticCursorCache, list[torch.Tensor], list[int]]:
    """Move the decoding rows into a buffer of their batch bucket (finished rows fill it up)."""
    keep = [i for i, r in enumerate(order) if r in live]
    size = _bucket(len(keep))
    keep += [i for i, r in enumerate(order) if r not in live][: size - len(keep)]
    idx = torch.tensor(keep, dtype=torch.long, device=state[0].device)
    small = owner.take(size, cache.capacity, layout, graphs)
    for dst, src in zip(small.keys + small.values, cache.keys + cache.values):
        torch.index_select(src, 0, idx, out=dst)
    owner.give(cache)
    return small, [t[idx] for t in state], [order[i] for i in keep]
