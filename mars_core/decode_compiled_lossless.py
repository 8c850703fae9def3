"""Lossless MARS on the static-shape cursor cache, compiled (`mode="lossless", compile=True`).

The eager path (`decode_exact`, `draft_groups="last"`) feeds each row its new real token (the
last step's bonus), its B - 1 drafts (the last step's mask predictions) and one group of B - 1
[MASK]s standing after the last draft. A group after the LAST draft sees the whole chain, so the
window is plain causal attention over

    bonus  d_1 .. d_{B-1}  M .. M            (at most 1 + (B - 1) + (B - 1) = 2B - 1 slots)

which is exactly the static MARS step's layout (`decode_compiled.static_step`): n real tokens,
then B - 1 masks, padding after. Only what is read off the logits differs:

* columns 0..B-1 verify: p_{i+1} at the chain's i-th token; greedy, drafts d_1..d_j are kept
  while each equals the argmax before it, and the token after them (the bonus) is p_{j+1}'s argmax;
* columns n..n+B-2 are the group's mask predictions: the next step's drafts, if every draft was
  accepted (the group stands after d_k); a row that rejected one has no drafts next step;
* the cursor moves past the bonus and the j accepted drafts (their keys and values were computed
  causally over committed text: exact); the rest of the window is overwritten next step.

So the output is greedy AR decoding's, token for token, like the eager path's (tested against it
and against `model.generate`). Greedy only: sampling (speculative rejection sampling) runs eagerly.

With prompt lookup (`prompt_lookup`), what a row drafts depends on its text, which lives on the
host: after the step's one sync the host builds the next feed (`lookup_refeed`, the rule of
`drafter.LookupDrafter`) and uploads it; the rest of the state stays on the device. The chain is
then up to 1 + max(B - 1, prompt_lookup_tokens) tokens, the group still after its last token.
"""
from __future__ import annotations

from typing import Callable, Iterator, TYPE_CHECKING

import torch

from .acceptance import confidence
from .decode_compiled import StaticCursorCache, _forward, run_static, window_inputs
from .decode_exact import cap_drafts
from .decoding import Rows, StepEvent, cut, pack
from .lookup import LookupPolicy

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def lossless_step(model: PreTrainedModel, cache: StaticCursorCache, feed: torch.Tensor, n_feed: torch.Tensor,
                  cursor: torch.Tensor, remaining: torch.Tensor, alive: torch.Tensor, tau: torch.Tensor,
                  stop_ids: torch.Tensor, noise: torch.Tensor | None, *, block: int, mask_id: int, pad_id: int,
                  metric: str, temperature: float, max_accept: int | None,
                  window: int, group: bool = True) -> tuple[torch.Tensor, ...]:
    """One verify-and-draft forward of every row at its cursor; all on the device.

    feed (R, K + 1) long: the bonus, then the drafts (n_feed - 1 of them; K = B - 1 unless prompt
    lookup drafts more); the rest as `static_step` (tau and noise are unused: greedy verification
    has no threshold and no randomness). group False: no masks after the chain (every row copied
    its drafts by prompt lookup), so no row has drafts from this step (M = 0 below, else B - 1).
    Returns the next (feed, n_feed, cursor, remaining, alive) and the packed outcome
    (R, 2(K + 1) + 2 + 3 + M): emitted tokens, confidences, kept, done, then [accepted drafts j,
    whether the next step has drafts, drafts verified this step, the group's M predictions: the
    next drafts, where it has them].
    """
    B, R, K = block, feed.shape[0], feed.shape[1] - 1
    M = B - 1 if group else 0  # the group's masks
    ids, pos = window_inputs(feed, n_feed, cursor, M, mask_id, pad_id)  # (R, K + 1 + M)
    col = torch.arange(K + 1, device=feed.device)
    keep = torch.cat([col.expand(R, K + 1), n_feed[:, None] + col[:M]], dim=1)  # p_1..p_{K+1}, the masks
    logits = _forward(model, cache, ids, pos, keep, window)  # (R, K + 1 + M, V)
    verify, masks = logits[:, :K + 1], logits[:, K + 1:]  # (R, K + 1, V): p_1..p_{K+1}; (R, M, V): the masks
    target = verify.argmax(dim=-1)  # (R, K + 1)
    drafts, k = feed[:, 1:], n_feed - 1  # (R, K), (R,)
    ok = (drafts == target[:, :K]) & (col[None, :K] < k[:, None])
    j = ok.long().cumprod(dim=1).sum(dim=1)  # (R,) accepted drafts
    bonus = target.gather(1, j[:, None])[:, 0]
    if max_accept is not None:
        j, bonus = cap_drafts(drafts, j, bonus, max_accept)
    tokens = torch.where(col < j[:, None], feed.gather(1, (col + 1).clamp(max=K).expand(R, K + 1)),
                         bonus[:, None])  # (R, K + 1): d_1..d_j, bonus, (bonus repeated: never read)
    conf = confidence(torch.softmax(verify.float(), dim=-1), tokens, metric)
    take, done = cut(tokens, j + 1, stop_ids, remaining)
    done = done | ~alive
    going = alive & ~done
    has_group = (j == k) & group  # the group stood after d_k: its predictions are the next drafts
    new_drafts = masks.argmax(dim=-1)  # (R, M)
    next_feed = torch.cat([bonus[:, None], new_drafts], dim=1)  # (R, 1 + M)
    next_n = torch.where(going & has_group, B, 1)
    extra = torch.cat([torch.stack([j, has_group.long(), k], dim=1), new_drafts], dim=1)
    return (next_feed, next_n, cursor + torch.where(alive, 1 + j, 0), remaining - take, going,
            pack(tokens, conf, take, done, extra))


def first_lossless(rows: Rows, logits: torch.Tensor, tau: float) -> tuple[StepEvent, list[list[int]]]:
    """The prefill's outcome (logits (N, B, V) at the last prompt token and the B - 1 masks): each
    row emits its AR token; the masks' predictions are its first drafts. Returns the event and
    each row's feed for the first step (the token, then its drafts)."""
    bonus = logits[:, :1].argmax(dim=-1)  # (N, 1)
    conf = confidence(torch.softmax(logits[:, :1].float(), dim=-1), bonus, rows.cfg.metric)
    drafts = logits[:, 1:].argmax(dim=-1).tolist()
    step = rows.commit(rows.active, bonus, conf, torch.ones_like(bonus[:, 0]), tau)
    _verified(rows, step.event, [0] * len(rows.active), rows.active, step.taken)
    return step.event, [t + d if t else [] for t, d in zip(step.taken, drafts)]


def after_lossless(rows: Rows, live: list[int], outcomes: list, event: StepEvent) -> dict[int, list[int]]:
    """Stats and replay fields of a step, as the eager path keeps them (`decode_exact`); returns
    each live row's next feed: its bonus, then the group's drafts where the step has them."""
    js = [int(o.extra[0]) for o in outcomes]
    rows.stats.drafted += sum(int(o.extra[2]) for o in outcomes)
    rows.stats.accepted_drafts += sum(js)
    _verified(rows, event, js, live, [o.taken for o in outcomes])
    return {r: o.taken[-1:] + ([int(t) for t in o.extra[3:]] if o.extra[1] else [])
            for r, o in zip(live, outcomes) if not o.done}


def lookup_refeed(policy: LookupPolicy) -> Callable:
    """The host half of compiled lossless MARS with prompt lookup (`run_static`'s `refeed`).

    Each row drafts as `lookup.LookupPolicy` says, from its prompt and output so far: the tokens
    that followed an earlier occurrence of its last n-gram, or its mask predictions (none after a
    step whose drafts it copied: the compiled path runs the "last" layout). The feed is B wide
    when no row drafts more than B - 1 tokens and 1 + max(B - 1, policy.tokens) otherwise, and
    carries the mask group unless every decoding row copied: up to three graphs per bucket and
    window, so that a step stays as narrow as it can. Returns (feed, n_feed, group).
    """
    copied: dict[int, bool] = {}  # per sequence: were its last drafts copied?

    def refeed(rows: Rows, order: list[int], feeds: dict[int, list[int]]) -> tuple[torch.Tensor, torch.Tensor, bool]:
        chains, now = [], []
        for r in order:
            feed = feeds.get(r) if not rows.finished[r] else None
            if not feed:
                chains.append([0])  # a finished row runs one token at its frozen cursor
                continue
            text = rows.prompts[r] + rows.out[r]
            drafts, copied[r] = policy.propose(text, policy.masks_after(feed[1:], copied.get(r, False)))
            chains.append(feed[:1] + drafts)
            now.append(copied[r])
        B = rows.block
        F = B if max(map(len, chains)) <= B else 1 + max(B - 1, policy.tokens)
        feed = torch.tensor([c + [0] * (F - len(c)) for c in chains], dtype=torch.long, device=rows.device)
        n_feed = torch.tensor([len(c) for c in chains], dtype=torch.long, device=rows.device)
        return feed, n_feed, not (now and all(now))

    return refeed


def _verified(rows: Rows, event: StepEvent, js: list[int], live: list[int], emitted: list[list[int]]) -> None:
    event.verified = [0] * len(rows.prompts)
    for r, a, e in zip(live, js, emitted):
        event.verified[r] = min(a, len(e))
    event.proposed = [list(t) for t in event.tokens]
    event.proposed_confidences = [list(c) for c in event.confidences]


@torch.no_grad()
def decode_compiled_lossless(model: PreTrainedModel, rows: Rows, mask_id: int,
                             pad_id: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops (greedy, exact; the config
    check refuses sampling and other draft groups)."""
    cfg = rows.cfg
    lookup, policy = {}, cfg.lookup_policy
    if policy is not None:
        lookup = dict(refeed=lookup_refeed(policy), max_feed=1 + max(cfg.block_size - 1, policy.tokens))
    yield from run_static(model, rows, mask_id, pad_id, compiled_step=lossless_step,
                          first=first_lossless, after=after_lossless, **lookup)
