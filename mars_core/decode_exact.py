"""Exact multi-token decoding: lossless MARS (self-verification) and MARS x speculative decoding.

`mode="lossless"`: a MARS model is its own drafter. The B - 1 mask predictions of one forward
are the drafts of the next; the next forward verifies them with the model's ordinary next-token
predictions (causal attention: a real token's prediction never sees what comes after it) and, in
the same forward, drafts again. Every emitted token is a verified draft or the model's own AR
token, so greedy output is token for token `mode="ar"`'s, and sampling (speculative rejection
sampling, `verify`) is distributed exactly as AR sampling. A step emits j + 1 tokens (j <= B - 1
accepted drafts): at most B, as MARS (up to `prompt_lookup_tokens` + 1 with prompt lookup).

`mode="spec"` (the paper's section 4.6): a draft model proposes K tokens (`speculative`); the
target verifies them in one forward that also carries the mask groups; after j accepted drafts
the target's own block after d_j (its AR token, then its B - 1 mask predictions, accepted left to
right by tau) is emitted instead of the single bonus token. At tau = 1 (or B = 1) it is standard
speculative decoding and exact; the tau-accepted tokens are not covered by the guarantee.

The mask groups (`verify_forward`, `DecodeConfig.draft_groups`): a group of B - 1 masks stands
right after some d_g and sees only the prefix and d_1..d_g, so after j accepted drafts the group
after d_j holds exactly what a plain MARS forward of prefix + d_1..d_j would predict. "all"
carries one group per possible j (new drafts or extra tokens whatever j is); "last", the
default, only the group after d_k (a step that rejects a draft leaves the next step without
drafts); "ends" the groups after d_0 and d_k. The bundled model's drafts are nearly always
accepted, so the narrower forward wins: docs/lossless.md has the measurements.

Randomness per sequence and step, in this order, from the row's own stream (`RowRandom`): the
draft model's noise (spec), K uniforms for the acceptance tests, then (B, V) Gumbel noise (row 0
for the bonus, rows 1.. for the new drafts or the extra tokens). Shapes never depend on the
batch, so a row decodes exactly as it would alone.
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch

from .acceptance import choose_tokens, confidence
from .decoding import Rows, StepEvent
from .drafter import Drafter, SelfDrafter
from .speculative import ModelDrafter, vocab_size
from .verify import after_drafts, block_after, draft_confidence, verify_drafts
from .verify_forward import CursorContext, NoCacheContext

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def cap_drafts(drafts: torch.Tensor, j: torch.Tensor, bonus: torch.Tensor,
               max_accept: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Emit at most `max_accept` tokens: keep j' = min(j, max_accept - 1) drafts and, where that
    drops an accepted draft, emit d_{j'+1} as the token after them.

    A verified draft is exactly the token the target would have emitted there (greedy: its
    argmax; sampling: it passed the acceptance test), so the cut output is still exact.
    drafts (R, K), j (R,), bonus (R,) -> (j', bonus') (R,), (R,).
    """
    capped = j.clamp(max=max_accept - 1)
    cut = capped < j
    if drafts.shape[1] == 0:
        return capped, bonus
    nxt = drafts.gather(1, capped.clamp(max=drafts.shape[1] - 1)[:, None])[:, 0]
    return capped, torch.where(cut, nxt, bonus)


def _context(model: PreTrainedModel, rows: Rows, extra: int, mask_id: int,
             pad_id: int) -> NoCacheContext | CursorContext:
    n = len(rows.prompts)
    if rows.cfg.cache == "none":
        return NoCacheContext(model, n, mask_id, pad_id, rows.device)
    capacity = max(len(p) for p in rows.prompts) + rows.cfg.max_new_tokens + extra
    return CursorContext(model, n, capacity, mask_id, pad_id, rows.device)


def _read_columns(row: list[float]) -> tuple[int, list[int]]:
    """A committed row's decoder columns (`RowOutcome.extra`): [j] (spec), or [j, has a group,
    the group's B - 1 new drafts] (lossless) -> (j, the new drafts; none without a group)."""
    j = int(row[0])
    if len(row) < 2 or not row[1]:
        return j, []
    return j, [int(t) for t in row[2:]]


@torch.no_grad()
def decode_exact(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int,
                 draft_model: PreTrainedModel | None = None, drafter: Drafter | None = None) -> Iterator[StepEvent]:
    """`mode="lossless"` (draft_model None) or `mode="spec"`, on cache "none" or "cursor".

    `drafter` replaces the drafts (tests feed adversarial ones): any `Drafter`.
    """
    cfg = rows.cfg
    B, spec = cfg.block_size, cfg.mode == "spec"
    if drafter is not None and not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must implement mars_core.drafter.Drafter, got {type(drafter).__name__}")
    V = vocab_size(model)
    if drafter is None and spec:
        draft_ctx = _context(draft_model, rows, cfg.draft_tokens + 2 * cfg.draft_block_size, mask_id, pad_id)
        drafter = ModelDrafter(draft_ctx, rows, cfg.draft_tokens, V)
    elif drafter is None:
        drafter = SelfDrafter(len(rows.prompts), B - 1)
    K = drafter.K  # drafts per step, at most
    target = _context(model, rows, K + (K + 1) * B + B, mask_id, pad_id)
    feed = [list(p) for p in rows.prompts]  # the target's new real tokens
    while rows.running():
        tau, live = rows.tau(), rows.active
        drafts, q = drafter.propose()
        verify, masks, sel = target.forward(feed, drafts, B, cfg.draft_groups)  # (R, k + 1, V), (R, G, B - 1, V)
        R, k = verify.shape[0], verify.shape[1] - 1
        V = verify.shape[-1]
        d = torch.tensor([x + [0] * (k - len(x)) for x in drafts], dtype=torch.long, device=rows.device)
        n_d = torch.tensor([len(x) for x in drafts], device=rows.device)
        uniform = gumbel = None
        if rows.random is not None:
            uniform = rows.random.noise(live, 1, K)[:, 0, :k]
            gumbel = rows.random.noise(live, B, V)
        j, bonus, probs = verify_drafts(d, n_d, None if q is None else q[:, :k], verify, cfg.temperature,
                                        uniform, None if gumbel is None else gumbel[:, 0])
        if cfg.max_accept is not None:
            j, bonus = cap_drafts(d, j, bonus, cfg.max_accept)
        at = torch.arange(R, device=rows.device)
        match = sel == j[:, None]  # (R, G): the group standing right after d_j, if the forward has it
        has_group = match.any(dim=1)
        if masks.shape[1]:
            group = masks[at, match.long().argmax(dim=1)]  # (R, B - 1, V)
        else:  # no group in this forward: has_group is False, so these are never read
            group = verify.new_zeros(R, B - 1, V)
        noise = None if gumbel is None else gumbel[:, 1:]
        if spec:
            cap = None if cfg.max_accept is None else cfg.max_accept - j  # drafts count towards the cap
            block, block_conf, n_block = block_after(bonus, probs[at, j], group, tau, cfg.metric,
                                                     cfg.temperature, noise, cap)
            n_block = torch.where(has_group, n_block, torch.ones_like(n_block))
            new_q = None
            extra = j[:, None]  # `_read_columns`: j alone
        else:
            block = bonus[:, None]
            block_conf = confidence(probs[at, j][:, None], block, cfg.metric)
            n_block = torch.ones_like(j)
            new_drafts, new_q = choose_tokens(group, cfg.temperature, noise)  # (R, B - 1), (R, B - 1, V)
            extra = torch.cat([j[:, None], has_group[:, None], new_drafts], dim=1)  # `_read_columns`
        tokens, conf, n = after_drafts(d, draft_confidence(probs, d, cfg.metric), j, block, block_conf, n_block)
        step = rows.commit(live, tokens, conf, n, tau, extra)
        event, emitted = step.event, step.taken
        columns = [_read_columns(o.extra) for o in step.rows]
        js, new = [j for j, _ in columns], [n for _, n in columns]
        event.verified = [0] * len(rows.prompts)
        for r, a, e in zip(live, js, emitted):
            event.verified[r] = min(a, len(e))
        # what a replay shows: the emitted tokens (verified drafts first), not a block of B
        event.proposed = [list(t) for t in event.tokens]
        event.proposed_confidences = [list(c) for c in event.confidences]
        rows.stats.drafted += sum(len(x) for x in drafts)
        rows.stats.accepted_drafts += sum(js)
        target.keep(js)
        feed = [e[a:] for e, a in zip(emitted, js)]
        drafter.update(js, emitted, new, None if rows.random is None else new_q)
        keep = rows.still_active()
        target.select(keep)
        drafter.select(keep)
        feed = [feed[i] for i in keep]
        yield event
