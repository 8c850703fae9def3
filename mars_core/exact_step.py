"""The one exact step: a draft shape per row, one forward, the longest verified path, the commit.

    plans (host)  ->  window inputs  ->  one forward at each row's cursor  ->  accept the longest
    path the model's own argmaxes confirm  ->  emit it and the token after it  ->  move the path's
    key/values next to the root  ->  the candidates of the group after the path's last node

Every greedy lossless decode runs it, eagerly or under `torch.compile` (the same function):
the chain of lossless MARS (a one-wide tree), a draft tree, a prompt-lookup chain and a planned
tree differ only in the plans (`draft_plan`). Rows of one forward may hold different shapes; they
are padded to one number of nodes N and groups G (a padding leaf hangs under the root, a padding
group is never read). Emitted tokens are confirmed drafts or the model's own argmax: the output
is greedy AR decoding's, token for token.

The step's outcome comes to the host in one tensor (`Rows.record`), its decoder columns named by
`EXTRA`: j (accepted drafts), the candidates' presence, ids and probabilities.
"""
from __future__ import annotations

from typing import NamedTuple, TYPE_CHECKING

import torch

from .acceptance import confidence
from .decoding import cut, pack
from .draft_plan import Candidates, Plan
from .tree import accept_path, stack_windows

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Window(NamedTuple):
    """One forward's inputs, every row padded to N nodes and G groups (W = P + 1 + N + G M)."""

    ids: torch.Tensor  # (R, W) long
    rel_pos: torch.Tensor  # (R, W) long, from each row's cursor
    pattern: torch.Tensor  # (R, W, W) bool
    prefix: torch.Tensor  # (R,) long: new real tokens before the root (the prompt, at the first step)
    parent: torch.Tensor  # (R, N + 1) long
    depth: torch.Tensor  # (R, N + 1) long
    tokens: torch.Tensor  # (R, N) long: the nodes' tokens, -1 at a padding leaf
    group_node: torch.Tensor  # (R, G) long: the node each group follows, -1 for a padding group


def build_window(plans: list[Plan], roots: list[list[int]], N: int, G: int, mask_id: int, pad_id: int,
                 device: torch.device | str, width: int | None = None) -> Window:
    """Row i: `roots[i]` (its new real tokens; the last is the root), then its plan's nodes padded
    to N with leaves under the root, then G groups of masks; `width` pads W."""
    shapes, groups = [], []
    for p in plans:
        real = p.shape.group_nodes
        if len(real) > G or p.shape.size > N:
            raise ValueError(f"a plan of {p.shape.size} nodes and {len(real)} groups does not fit {N} and {G}")
        shapes.append(p.shape.padded(N, G))
        groups.append(list(real) + [-1] * (G - len(real)))
    prefixes = [len(r) - 1 for r in roots]
    pattern, rel_pos = stack_windows(shapes, prefixes, "cpu")
    W = max(width or 0, pattern.shape[1])
    if W > pattern.shape[1]:  # pad further: a padding slot sees itself only
        extra = W - pattern.shape[1]
        pattern = torch.nn.functional.pad(pattern, (0, extra, 0, extra))
        pattern[:, -extra:, -extra:] = torch.eye(extra, dtype=torch.bool)
        rel_pos = torch.cat([rel_pos, torch.arange(W - extra, W).expand(len(plans), -1)], dim=1)
    M = shapes[0].n_masks
    ids = []
    for r, p in zip(roots, plans):  # a padding leaf holds the pad token
        row = list(r) + list(p.tokens) + [pad_id] * (N - len(p.tokens)) + [mask_id] * (G * M)
        ids.append(row + [pad_id] * (W - len(row)))
    return Window(
        ids=torch.tensor(ids).to(device), rel_pos=rel_pos.to(device), pattern=pattern.to(device),
        prefix=torch.tensor(prefixes).to(device),
        parent=torch.stack([s.parent for s in shapes]).to(device),
        depth=torch.stack([s.node_depth for s in shapes]).to(device),
        # -1 at a padding leaf: no argmax equals it, so it is never accepted (nor counted as a draft)
        tokens=torch.tensor([list(p.tokens) + [-1] * (N - len(p.tokens)) for p in plans],
                            dtype=torch.long).reshape(len(plans), N).to(device),
        group_node=torch.tensor(groups, dtype=torch.long).reshape(len(plans), G).to(device))


class Decided(NamedTuple):
    j: torch.Tensor  # (R,) accepted drafts
    path: torch.Tensor  # (R, D) the accepted node at each depth (0 past j)
    packed: torch.Tensor  # (R, ...) the host's one read: `pack`ed tokens, confidences, cut, EXTRA


def decide(node_logits: torch.Tensor, group_logits: torch.Tensor, w: Window, remaining: torch.Tensor,
           alive: torch.Tensor, stop_ids: torch.Tensor, *, depth: int, topk: int, max_accept: int | None,
           metric: str) -> Decided:
    """Greedy verification of every row's shape: node_logits (R, N + 1, V) at the root and each
    node, group_logits (R, G, M, V) at the groups' masks; `depth` D >= the deepest node."""
    R = node_logits.shape[0]
    at = torch.arange(R, device=node_logits.device)
    pred = node_logits.argmax(dim=-1)  # (R, N + 1)
    path, j = accept_path(w.parent, w.depth, pred, w.tokens, depth)
    if max_accept is not None:  # a confirmed node is the model's own token: it may be the bonus instead
        j = j.clamp(max=max_accept - 1)
    last = torch.where(j > 0, path.gather(1, (j - 1).clamp_min(0)[:, None])[:, 0], 0)  # (R,) the path's end
    bonus = pred[at, last]
    nodes = torch.cat([w.tokens.new_zeros(R, 1), w.tokens], dim=1)  # node v's token at column v
    d = torch.arange(depth + 1, device=j.device)[None]
    on_path = torch.cat([path, path.new_zeros(R, 1)], dim=1)  # (R, D + 1)
    tokens = torch.where(d < j[:, None], nodes.gather(1, on_path), bonus[:, None])  # (R, D + 1)
    before = torch.cat([path.new_zeros(R, 1), path], dim=1)  # the node each emitted token was predicted at
    before = torch.where(d <= j[:, None], before, last[:, None])
    probs = torch.softmax(node_logits.gather(1, before[..., None].expand(-1, -1, node_logits.shape[-1])).float(), -1)
    conf = confidence(probs, tokens, metric)
    take, done = cut(tokens, j + 1, stop_ids, remaining)
    done = done | ~alive
    M = group_logits.shape[2]
    if group_logits.shape[1]:
        match = w.group_node == last[:, None]  # (R, G): the group standing after the path's end
        has = match.any(dim=1) & alive & ~done
        chosen = group_logits[at, match.long().argmax(dim=1)]  # (R, M, V)
        top = torch.softmax(chosen.float(), dim=-1).topk(topk, dim=-1)  # (R, M, k)
        top_ids, top_p = top.indices.flatten(1).double(), top.values.flatten(1).double()
    else:  # a window without groups (every row copied its drafts and keeps no masks after them)
        has = torch.zeros_like(alive)
        top_ids = top_p = j.new_zeros(R, M * topk).double()
    extra = torch.cat([j[:, None].double(), has[:, None].double(), top_ids, top_p], dim=1)
    return Decided(j, path, pack(tokens, conf, take, done, extra))


def read_extra(row: list[float], n_masks: int, topk: int) -> tuple[int, Candidates]:
    """The decoder columns of one packed row (`RowOutcome.extra`): j and the next candidates."""
    j, has = int(row[0]), bool(row[1])
    if not has:
        return j, Candidates()
    ids = [int(x) for x in row[2:2 + n_masks * topk]]
    probs = row[2 + n_masks * topk:2 + 2 * n_masks * topk]
    return j, Candidates(tuple(tuple(ids[m * topk:(m + 1) * topk]) for m in range(n_masks)),
                         tuple(tuple(probs[m * topk:(m + 1) * topk]) for m in range(n_masks)))


def keep_columns(w: Window, N: int, G: int, M: int) -> torch.Tensor:
    """(R, N + 1 + G M): the columns of the root and nodes, then of the groups' masks."""
    base = w.prefix[:, None]
    return torch.cat([base + torch.arange(N + 1, device=base.device)[None],
                      base + 1 + N + torch.arange(G * M, device=base.device)[None]], dim=1)


def move_path(cache, cursor: torch.Tensor, w: Window, path: torch.Tensor, j: torch.Tensor) -> None:
    """Put each row's first j accepted path nodes' key/values at the slots right after its root
    (node v of the window sits at slot cursor + prefix + v); a chain's are there already."""
    D = path.shape[1]
    root = cursor + w.prefix  # (R,)
    d = torch.arange(D, device=path.device)[None]
    dst = root[:, None] + 1 + d  # (R, D)
    src = torch.where(d < j[:, None], root[:, None] + path, dst)
    rows = torch.arange(path.shape[0], device=path.device)[:, None, None]
    for buf in cache.keys + cache.values:  # (R, H, capacity, E)
        heads = torch.arange(buf.shape[1], device=path.device)[None, :, None]
        moved = buf[rows, heads, src[:, None, :]]  # (R, H, D, E), gathered before any write
        buf.index_put_((rows, heads, dst[:, None, :]), moved)


def window_forward(model: PreTrainedModel, cache, w: Window, cursor: torch.Tensor, n_masks: int,
                   window: int) -> torch.Tensor:
    """The forward of `w` at each row's cursor on a `StaticCursorCache`, attending over its first
    `window` slots (the committed ones, and the window's own by its pattern); the logits
    (R, N + 1 + G M, V) at the root, the nodes and the groups' masks."""
    W = w.ids.shape[1]
    N, G = w.tokens.shape[1], w.group_node.shape[1]
    rel = torch.arange(window, device=cursor.device)[None] - cursor[:, None]  # (R, window) slot - cursor
    inside = (rel >= 0) & (rel < W)
    seen = w.pattern.gather(2, rel.clamp(0, W - 1)[:, None, :].expand(-1, W, -1))  # (R, W, window)
    visible = (rel < 0)[:, None, :] | (inside[:, None, :] & seen)
    cache.slots, cache.window = cursor[:, None] + torch.arange(W, device=cursor.device), window
    logits = model(input_ids=w.ids, attention_mask=visible[:, None], position_ids=cursor[:, None] + w.rel_pos,
                   cache=cache, use_cache=True, logits_to_keep=keep_columns(w, N, G, n_masks)).logits
    cache.slots, cache.window = None, cache.capacity
    return logits


def window_step(model: PreTrainedModel, cache, w: Window, cursor: torch.Tensor, remaining: torch.Tensor,
                alive: torch.Tensor, stop_ids: torch.Tensor, *, n_masks: int, depth: int, topk: int,
                max_accept: int | None, metric: str, window: int) -> tuple[torch.Tensor, ...]:
    """One exact step on a `StaticCursorCache` (eager or compiled): the forward of `w` at each row's
    cursor (attending over the buffer's first `window` slots), `decide`, the path's key/values
    moved. Returns the next (cursor, remaining, alive) and the packed outcome."""
    R = w.ids.shape[0]
    N, G = w.tokens.shape[1], w.group_node.shape[1]
    logits = window_forward(model, cache, w, cursor, n_masks, window)
    V = logits.shape[-1]
    out = decide(logits[:, :N + 1], logits[:, N + 1:].reshape(R, G, n_masks, V), w, remaining, alive, stop_ids,
                 depth=depth, topk=topk, max_accept=max_accept, metric=metric)
    move_path(cache, cursor, w, out.path, out.j)
    take = out.packed[:, 2 * (depth + 1)].long()
    going = alive & ~out.packed[:, 2 * (depth + 1) + 1].bool()
    return cursor + torch.where(alive, w.prefix + 1 + out.j, 0), remaining - take, going, out.packed
