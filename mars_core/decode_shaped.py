"""Greedy lossless MARS with drafts of any shape: chain, tree, prompt lookup, planned by confidence.

The loop around `exact_step`: each step the planner (`draft_plan.Planner`) gives every row its
drafts from the last step's candidates and its text, `build_window` lays them out, one forward
verifies them (`window_step`: eager, or compiled with static shapes, the same function), and the
packed outcome is the step's one host read. Three ways to run it:

- cache "none", the reference: every forward recomputes the text; the root and each node get
  their own causal sequence, text + path + B - 1 masks, all in one batched call (no 4-D window:
  it checks the window layout independently);
- cache "cursor", eager: the window at each row's cursor on a preallocated buffer, its width
  the step's own (rows padded to the step's largest shape);
- cache "cursor", `compile`: the same step under `torch.compile`, every step after the first
  padded to the config's fixed nodes and groups (`draft_budget`, the tree's size, the chain's B - 1
  or lookup's drafts), so one graph per batch bucket and attention window, and one per prefill
  width for the first step.
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch

from .static_cache import CAPACITY_STEP, PREFILL_STEP, _bucket, _shrink, compiled, resolve_mode, static_state
from .decoding import Rows, StepEvent, left_pad, positions
from .draft_plan import Plan, Planner, budget, step_size
from .exact_step import build_window, decide, read_extra, window_step
from .masks import causal_mask
from .tree import chain

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@torch.no_grad()
def decode_shaped(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops (greedy, exact)."""
    cfg = rows.cfg
    if cfg.cache == "none":
        yield from _reference(model, rows, mask_id, pad_id)
        return
    N, G, D, k = budget(cfg)
    M = cfg.block_size - 1
    dev = rows.device
    mode = resolve_mode(cfg.compile, dev) if cfg.compile else None
    graphs = mode in ("reduce-overhead", "max-autotune")
    step = compiled(window_step, mode) if mode else window_step
    n = len(rows.prompts)
    span = 1 + N + G * M
    need = max(len(p) for p in rows.prompts) + cfg.max_new_tokens + max(span, M + 1) + 1
    capacity = -(-need // CAPACITY_STEP) * CAPACITY_STEP
    owner = static_state(model)
    layout = owner.kv_layout(model, mask_id, pad_id)
    cache = owner.take(n, capacity, layout, graphs)
    planner = Planner(cfg)
    state = [torch.zeros(n, dtype=torch.long, device=dev),  # cursor: cached tokens per buffer row
             torch.tensor([cfg.max_new_tokens] * n, device=dev),  # remaining
             torch.ones(n, dtype=torch.bool, device=dev)]  # alive
    order = list(range(n))  # buffer row -> sequence
    plans: dict[int, Plan] = {r: planner.first() for r in range(n)}
    roots: dict[int, list[int]] = {r: list(p) for r, p in enumerate(rows.prompts)}
    copied: dict[int, bool] = {}
    kw = dict(n_masks=M, depth=D, topk=k, max_accept=cfg.max_accept, metric=cfg.metric)
    first = True
    try:
        while rows.running():
            live = set(rows.active)
            dead = Plan(chain(0, M, (0,)), ())  # a finished row still in a compiled batch
            step_plans = [plans[r] if r in live else dead for r in order]
            step_roots = [roots[r] if r in live else [pad_id] for r in order]
            if mode and first:  # the prefill graph: one per prefill width
                width = PREFILL_STEP * _bucket(-(-max(map(len, step_roots)) + M) // PREFILL_STEP)
                w = build_window(step_plans, step_roots, 0, 1, mask_id, pad_id, dev, width=min(width, capacity))
            else:
                n_step, g_step = step_size(step_plans, cfg, bool(mode))
                w = build_window(step_plans, step_roots, n_step, g_step, mask_id, pad_id, dev)
            # a row has cached all it emitted but the root (nothing before its first step)
            cached = 0 if first else max(len(rows.prompts[r]) + len(rows.out[r]) - 1 for r in order)
            reach = cached + w.ids.shape[1]
            window = _attended(reach, capacity) if mode else reach
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            *state, packed = step(model, cache, w, *state, rows.stop_ids, **kw, window=window)
            if graphs:
                state = [t.clone() for t in state]
            packed = packed.tolist()  # the one host sync
            mine = [(r, p) for r, p in zip(order, packed) if r in live]
            outcome = rows.record([r for r, _ in mine], [p for _, p in mine], rows.tau(), D + 1)
            event = outcome.event
            _bookkeep(rows, event, [r for r, _ in mine], outcome.rows, plans, first, M, k, planner, roots, copied)
            first = False
            rows.still_active()
            if rows.active:
                if mode and _bucket(len(rows.active)) < len(order):
                    cache, state, order = _shrink(owner, cache, state, order, set(rows.active), layout, graphs)
                elif not mode and len(rows.active) < len(order):
                    idx = [order.index(r) for r in rows.active]
                    cache.batch_select_indices(torch.tensor(idx, dtype=torch.long, device=dev))
                    state = [t[idx] for t in state]
                    order = list(rows.active)
            yield event
    finally:
        owner.give(cache)


def _attended(reach: int, capacity: int) -> int:
    """The slots a compiled step attends over: `reach` rounded up to CAPACITY_STEP times a power
    of two (a logarithmic number of graphs), at most the buffer."""
    window = CAPACITY_STEP
    while window < reach:
        window *= 2
    return min(capacity, window)


def _bookkeep(rows: Rows, event: StepEvent, live: list[int], outcomes: list, plans: dict[int, Plan], first: bool,
              M: int, k: int, planner: Planner, roots: dict, copied: dict) -> None:
    """The step's stats and replay fields; each row's next root (its last emitted token) and plan."""
    event.verified = [0] * len(rows.prompts)
    for r, o in zip(live, outcomes):
        j, cands = read_extra(o.extra, M, k)
        event.verified[r] = min(j, len(o.taken))
        if not first:  # real drafts only: a padding leaf is not a draft
            rows.stats.drafted += plans[r].shape.size
            rows.stats.accepted_drafts += j
        roots[r] = o.taken[-1:]
        plans[r] = planner.plan(cands, rows.prompts[r] + rows.out[r], copied.get(r, False))
        copied[r] = plans[r].copied
    event.proposed = [list(t) for t in event.tokens]
    event.proposed_confidences = [list(c) for c in event.confidences]


def _reference(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int) -> Iterator[StepEvent]:
    """Cache "none": the root and every node of a row get their own causal forward, text + path +
    B - 1 masks (batched, left-padded); then the same `decide`."""
    cfg, dev = rows.cfg, rows.device
    _, _, D, k = budget(cfg)
    M = cfg.block_size - 1
    planner = Planner(cfg)
    plans = {r: planner.first() for r in range(len(rows.prompts))}
    roots: dict[int, list[int]] = {}
    copied: dict[int, bool] = {}
    first = True
    while rows.running():
        live = list(rows.active)
        step_plans = [plans[r] for r in live]
        N, G = step_size(step_plans, cfg, False)
        seqs = []
        for r, p in zip(live, step_plans):
            text = rows.prompts[r] + rows.out[r]  # its last token is the root
            tokens = list(p.tokens) + [mask_id] * (N - len(p.tokens))
            anc = p.shape.padded(N, G).ancestry.tolist()
            seqs += [text + [tokens[v - 1] for v in range(1, N + 1) if anc[u][v]] + [mask_id] * M for u in range(N + 1)]
        ids, valid = left_pad(seqs, pad_id, dev)
        logits = model(input_ids=ids, attention_mask=causal_mask(valid, ids.shape[1]), position_ids=positions(valid),
                       logits_to_keep=M + 1).logits  # (R (N + 1), B, V)
        R, V = len(live), logits.shape[-1]
        logits = logits.view(R, N + 1, M + 1, V)
        w = build_window(step_plans, [[pad_id]] * R, N, G, mask_id, pad_id, dev)  # the shapes; the layout is unused
        groups = logits[:, :, 1:].gather(1, w.group_node.clamp_min(0)[:, :, None, None].expand(-1, -1, M, V))
        remaining = torch.tensor([cfg.max_new_tokens - len(rows.out[r]) for r in live], device=dev)
        out = decide(logits[:, :, 0], groups, w, remaining, torch.ones(R, dtype=torch.bool, device=dev),
                     rows.stop_ids, depth=D, topk=k, max_accept=cfg.max_accept, metric=cfg.metric)
        outcome = rows.record(live, out.packed.tolist(), rows.tau(), D + 1)
        _bookkeep(rows, outcome.event, live, outcome.rows, plans, first, M, k, planner, roots, copied)
        first = False
        rows.still_active()
        yield outcome.event
