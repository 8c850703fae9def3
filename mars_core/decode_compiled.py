"""The cursor KV cache with static shapes, for `torch.compile` and CUDA graphs (`compile=True`).

Same decoding as `decode_cursor` (token for token in fp32), arranged so that the forward and
everything around it compile into one graph per batch bucket and attention window:

* **Static shapes.** Every step after the first feeds each row a fixed width W = 2B - 1 (B real
  tokens at most, then B - 1 [MASK]s, then padding), writes at the row's own cursor into a
  preallocated buffer (capacity C, rounded up to a multiple of 128), and attends over a window
  of its first slots: the slots the rows have reached, rounded up to 128 times a power of two
  (at most C), with a mask built on the device from the cursors. When the rows still decoding
  fit a smaller batch bucket (1, 2, 3, 4, 6, 8, 12, 16, ...: powers of two and 1.5x them), they
  move into a buffer of that size. So a batch of N compiles at most
  (1 + 2 log2 N) * (1 + ceil(log2(C / 128))) graphs per model and settings (24 for N = 16 and
  256 new tokens), fewer in practice: the batch shrinks late, once the window has grown.
* **Writes in place.** The cache writes with `index_put_`, which inductor keeps in place; a
  `scatter_` into a graph input is functionalised into a copy of the whole buffer and a copy
  back, per layer and step (docs/experiments.md: that made the step slower than eager).
* **State on the device.** The rows' cursors, last accepted tokens, remaining budgets and
  liveness are tensors that the compiled step reads and returns; the host never rebuilds them.
  The step also does acceptance and the cut at EOS / `max_new_tokens`, and packs its outcome
  into one tensor: `.tolist()` on it is the step's one host sync, which `Rows.record` reads.
  A finished row stays in its buffer row until the next shrink; its cursor stops moving and its
  output is ignored.
* **The first step** (every prompt plus B - 1 masks, all rows at cursor 0) is a second compiled
  function, `static_prefill`: its width is padded to a prefill bucket (32 times a batch bucket:
  32, 64, 96, 128, 192, ...), so that prompts of similar lengths share a graph. It is the same
  cost for AR and MARS, and eagerly it was 16% of a compiled MARS decode at batch 1 and 22% at
  batch 16 (docs/experiments.md). Acceptance of its logits stays eager (once per decode). The
  buffers are allocated before it from the key/value layout of the model, read once per model
  from a one-token eager forward.

Under `mode="reduce-overhead"` (CUDA graphs) the buffers are marked static and reused across
decodes of the same shape (a per-model pool), so a graph is captured once and replayed.
"""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Iterator, TYPE_CHECKING

import torch

from .acceptance import accept
from .decoding import Rows, StepEvent, cut, pack
from .gate import no_masks
# StaticState, static_state and the rest are re-exported: tools and tests reach them through this module
from .static_cache import (CAPACITY_STEP, PREFILL_STEP, StaticCursorCache, StaticState, _bucket, _shrink,  # noqa: F401
                           compiled, resolve_mode, static_state)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# ---------------------------------------------------------------------------------------------
# the compiled step
# ---------------------------------------------------------------------------------------------


def static_step(model: PreTrainedModel, cache: StaticCursorCache, feed: torch.Tensor, n_feed: torch.Tensor,
                cursor: torch.Tensor, remaining: torch.Tensor, alive: torch.Tensor, tau: torch.Tensor,
                stop_ids: torch.Tensor, noise: torch.Tensor | None, *, block: int, mask_id: int, pad_id: int,
                metric: str, temperature: float, max_accept: int | None, window: int,
                repeat_guard: bool = False) -> tuple[torch.Tensor, ...]:
    """One forward of every row at its cursor, acceptance and the cut; all on the device.

    feed (R, B) long: each row's last accepted tokens (first n_feed of them real); n_feed,
    cursor, remaining (R,) long; alive (R,) bool; tau (R,) float64; stop_ids (S,) long;
    noise (R, B, V) or None.
    Returns the next (feed, n_feed, cursor, remaining, alive) and the packed outcome (R, 2B + 2).
    """
    B = block
    ids, pos = window_inputs(feed, n_feed, cursor, B - 1, mask_id, pad_id)
    keep = n_feed[:, None] - 1 + torch.arange(B, device=feed.device)  # (R, B): the last real token and the masks
    logits = _forward(model, cache, ids, pos, keep, window)  # (R, B, V)
    tokens, conf, n_acc = accept(logits, tau, metric, temperature, noise, max_accept, repeat_guard)
    take, done = cut(tokens, n_acc, stop_ids, remaining)
    done = done | ~alive
    going = alive & ~done
    # a finished row keeps feeding one token at a frozen cursor: it never runs past the buffer
    return (tokens, torch.where(going, take, 1), cursor + torch.where(alive, n_feed, 0),
            remaining - take, going, pack(tokens, conf, take, done))


def window_inputs(feed: torch.Tensor, n_feed: torch.Tensor, cursor: torch.Tensor, n_masks: int, mask_id: int,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's fixed-width window: each row's first n_feed tokens of `feed` (R, F), then n_masks
    masks (B - 1 for MARS), then padding, W = F + n_masks wide (2B - 1 for MARS, whose F is B).
    Returns ids and position ids (R, W); a position id is also the buffer slot written."""
    R, F = feed.shape
    W = F + n_masks
    col = torch.arange(W, device=feed.device)
    n = n_feed[:, None]
    real = feed.gather(1, col.clamp(max=F - 1).expand(R, W))
    ids = torch.where(col < n, real, torch.where(col < n + n_masks, mask_id, pad_id))
    return ids, cursor[:, None] + col


def static_prefill(model: PreTrainedModel, cache: StaticCursorCache, ids: torch.Tensor, n: torch.Tensor, *,
                   block: int) -> torch.Tensor:
    """The first step: row i's prompt (n[i] tokens) and block - 1 masks at slots [0, P), padded
    to the prefill width P; returns the logits (R, block, V) at its last prompt token and masks.

    ids (R, P) long; n (R,) long. What `cursor_forward` does with every cursor at 0, at a fixed
    width (the padding sits beyond each row's causal horizon, and later steps overwrite it).
    """
    R, P = ids.shape
    pos = torch.arange(P, device=ids.device).expand(R, P)  # (R, P) position id = buffer slot
    keep = n[:, None] - 1 + torch.arange(block, device=ids.device)  # (R, B)
    return _forward(model, cache, ids, pos, keep, P)


def _forward(model: PreTrainedModel, cache: StaticCursorCache, ids: torch.Tensor, pos: torch.Tensor,
             keep: torch.Tensor, window: int) -> torch.Tensor:
    """ids, pos (R, W): tokens written at slots `pos`, each query seeing the slots <= its own
    among the first `window`; returns the logits (R, B, V) at the columns `keep` (R, B)."""
    visible = torch.arange(window, device=ids.device) <= pos[:, :, None]  # (R, W, window)
    cache.slots, cache.window = pos, window
    # a 4-D mask is used as written (the model builds none of its own)
    logits = model(input_ids=ids, attention_mask=visible[:, None], position_ids=pos,
                   cache=cache, use_cache=True, logits_to_keep=keep).logits
    cache.slots, cache.window = None, cache.capacity
    return logits


# ---------------------------------------------------------------------------------------------
# the decode loop
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def decode_compiled(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops (`compile=True`); the
    tokens land in `rows.out`, as with `decode_cursor`. The compiled prefill, its acceptance by the
    tau rule (eager, once), then the compiled `static_step` until every row stops, shrinking the
    batch into smaller buckets as rows finish."""
    cfg, dev, B = rows.cfg, rows.device, rows.block
    # an AR decode (B = 1) feeds no mask: a mask-gated model's graphs are then the base's alone,
    # with no adapter computed and selected away (the promise is made per forward: `no_masks`)
    quiet = partial(no_masks, model) if B == 1 else contextlib.nullcontext
    mode = resolve_mode(cfg.compile, dev)
    graphs = mode in ("reduce-overhead", "max-autotune")  # CUDA graphs: fixed buffer addresses
    step, prefill = compiled(static_step, mode), compiled(static_prefill, mode)
    N = len(rows.prompts)
    span = 2 * B  # a step writes below cursor + 2B - 1
    need = max(len(p) for p in rows.prompts) + cfg.max_new_tokens + span
    capacity = -(-need // CAPACITY_STEP) * CAPACITY_STEP
    owner = static_state(model)
    layout = owner.kv_layout(model, mask_id, pad_id)
    cache = owner.take(N, capacity, layout, graphs)
    try:
        tau = rows.tau()
        ids, n = _prefill_inputs(rows.prompts, B, mask_id, pad_id, capacity, dev)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with quiet():
            logits = prefill(model, cache, ids, n, block=B)  # (N, B, V)
        tokens, conf, n_acc = rows.accept(logits, rows.active, tau)
        first = rows.commit(rows.active, tokens, conf, n_acc, tau)
        vocab = logits.shape[-1]
        order = list(range(N))  # buffer row -> sequence index
        loop = _initial_state(rows, first.taken, dev, B)  # the rows' tensors the step reads and returns
        rows.still_active()
        yield first.event
        kw = dict(block=B, mask_id=mask_id, pad_id=pad_id, metric=cfg.metric,
                  temperature=float(cfg.temperature), max_accept=cfg.max_accept, repeat_guard=cfg.repeat_guard)
        while rows.running():
            tau = rows.tau()
            live = set(rows.active)
            taus = torch.full((len(order),), tau, dtype=torch.float64, device=dev)
            noise = _noise(rows, order, live, B, vocab) if rows.random is not None else None
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with quiet():
                *loop, packed = step(model, cache, *loop, taus, rows.stop_ids, noise, **kw,
                                      window=_window(rows, order, span, cache.capacity))
            if graphs:  # a replay overwrites its outputs: keep copies of what the next step reads
                loop = [t.clone() for t in loop]
            packed = packed.tolist()  # the one host sync
            mine = [(r, p) for r, p in zip(order, packed) if r in live]
            outcome = rows.record([r for r, _ in mine], [p for _, p in mine], tau, B)
            rows.still_active()
            n_live = len(rows.active)
            if 0 < n_live and _bucket(n_live) < len(order):
                cache, loop, order = _shrink(owner, cache, loop, order, set(rows.active), layout, graphs)
            yield outcome.event
    finally:
        owner.give(cache)


def _prefill_inputs(prompts: list[list[int]], B: int, mask_id: int, pad_id: int, capacity: int,
                    dev: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (N, P): each prompt, B - 1 masks, padding to the prefill width P; n (N,): the prompts'
    lengths. P is the widest row rounded up to PREFILL_STEP times a batch bucket (at most the
    buffer's capacity, which every row fits)."""
    width = max(len(p) for p in prompts) + B - 1
    P = min(capacity, PREFILL_STEP * _bucket(-(-width // PREFILL_STEP)))
    ids = [list(p) + [mask_id] * (B - 1) + [pad_id] * (P - len(p) - B + 1) for p in prompts]
    return (torch.tensor(ids, dtype=torch.long, device=dev),
            torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev))


def _window(rows: Rows, order: list[int], span: int, capacity: int) -> int:
    """The slots a step attends over: every buffer row writes below len(prompt) + len(out) + W
    (its cursor trails that by the tokens it feeds; W < span), finished rows included, as they
    still run at their frozen cursor. Rounded up to CAPACITY_STEP times a power of two, so that a
    long decode compiles a logarithmic number of graphs (one per window) and attends over < 2x
    what it needs."""
    reach = max(len(rows.prompts[r]) + len(rows.out[r]) for r in order) + span
    window = CAPACITY_STEP
    while window < reach:
        window *= 2
    return min(capacity, window)


def _initial_state(rows: Rows, feed: list[list[int]], dev: torch.device | str, B: int) -> list[torch.Tensor]:
    N = len(rows.prompts)
    padded = [f + [0] * (B - len(f)) if f else [0] * B for f in feed]
    alive = [not rows.finished[r] for r in range(N)]
    return [
        torch.tensor(padded, dtype=torch.long, device=dev),  # feed (N, B)
        torch.tensor([max(len(f), 1) for f in feed], dtype=torch.long, device=dev),  # n_feed
        torch.tensor([len(p) for p in rows.prompts], dtype=torch.long, device=dev),  # cursor
        torch.tensor([rows.cfg.max_new_tokens - len(o) for o in rows.out], dtype=torch.long, device=dev),
        torch.tensor(alive, dtype=torch.bool, device=dev),
    ]


def _noise(rows: Rows, order: list[int], live: set[int], B: int, vocab: int) -> torch.Tensor:
    """Each decoding row draws from its own stream, exactly as in the eager decoders."""
    noise = torch.zeros(len(order), B, vocab, device=rows.device)
    idx = [i for i, r in enumerate(order) if r in live]
    noise[idx] = rows.random.noise([order[i] for i in idx], B, vocab)
    return noise


