"""Lossless MARS with a draft tree (`DecodeConfig(mode="lossless", draft_tree=(2, 2, 1))`).

Plain lossless MARS drafts the top-1 of each of the B - 1 masks and verifies that chain. Here the
drafts are a tree (`tree.DraftTree`): the top-k_d mask candidates at distance d in every
combination, verified in one forward that also carries a group of masks after every node. The
step accepts the longest path the model's own predictions confirm, emits it and the model's
token after it, and drafts the next tree from the group after the path's last node. Every
emitted token is a confirmed draft or the model's own token: greedy output is `mode="ar"`'s,
token for token. Greedy only (a tree has no single proposal distribution to correct against).

Two contexts, as for the chain (`verify_forward`):

- cache "none", the reference: every forward recomputes the text; the root and each node u get
  their own causal sequence, prefix + bonus + path(u) + B - 1 masks, all in one batched call
  (no 4-D tree mask: it checks the one-forward layout independently).
- cache "cursor": the window [root | nodes | groups] at each row's cursor with the tree's 4-D
  mask. The accepted path's nodes are not contiguous in the window unless it is the top-1 chain
  (nodes 1..D, depth-first order), so their key/values are gathered to the slots after the root
  (one gather and scatter per layer, only on a step that needs it). Nothing is ever recomputed.

With `prompt_lookup` n, a row whose text's last n-gram (or a longer one) occurred before drafts
the chain of up to `prompt_lookup_tokens` tokens that followed it instead of the tree (both
shapes padded to the same number of nodes, so rows of either kind share one window), with a
group of masks after every copied node too.

Replayed without decoding by `benchmarks.tree_bound` (its "k1,k2,k3" rows; `switch`, `lookup_tokens`
for the lookup chain): the forward counts of this decoder are that replay's, prompt for prompt
(tests/test_tree.py).
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch

from .acceptance import confidence
from .decoding import Rows, StepEvent
from .tree import DraftShape, DraftTree, accept_path, chain
from .verify import after_drafts
from .verify_forward import CursorContext, NoCacheContext

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class TreeNoCache:
    """The reference: one causal sequence per node, prefix + bonus + path + masks, batched."""

    def __init__(self, ctx: NoCacheContext, shapes: list[DraftShape]):
        self.ctx, self.n_masks = ctx, shapes[0].n_masks
        self.paths = [[[w for w in range(1, s.size + 1) if anc[u][w]] for u in range(s.size + 1)]
                      for s in shapes for anc in [s.ancestry.tolist()]]  # per shape, per node: its path
        self.nodes: list[list[int]] = []

    def forward(self, bonus: torch.Tensor, nodes: torch.Tensor, kind: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """bonus (R,), nodes (R, N), kind: each row's shape -> verify (R, N + 1, V) (the prediction
        after the root and after each node) and groups (R, N + 1, B - 1, V) (the masks after each)."""
        ctx, M = self.ctx, self.n_masks
        self.nodes = nodes.tolist()
        ctx.seq = [s + [b] for s, b in zip(ctx.seq, bonus.tolist())]
        seqs = [s + [toks[w - 1] for w in path] + [ctx.mask_id] * M
                for s, toks, c in zip(ctx.seq, self.nodes, kind) for path in self.paths[c]]
        logits = ctx._forward(seqs, M + 1)  # (R (N + 1), B, V)
        R, V = len(ctx.seq), logits.shape[-1]
        logits = logits.view(R, nodes.shape[1] + 1, M + 1, V)
        return logits[:, :, 0], logits[:, :, 1:]

    def keep(self, paths: list[list[int]], j: list[int]) -> None:
        """Row i's first j[i] path nodes become committed text."""
        self.ctx.seq = [s + [toks[v - 1] for v in p[:a]] for s, toks, p, a in zip(self.ctx.seq, self.nodes, paths, j)]

    def select(self, keep: list[int]) -> None:
        self.ctx.select(keep)


class TreeCursor:
    """The window at each row's cursor on the `CursorCache`, one model call."""

    def __init__(self, ctx: CursorContext, shapes: list[DraftShape]):
        self.ctx, self.n_masks = ctx, shapes[0].n_masks
        self.pattern = torch.stack([s.layout[0] for s in shapes]).to(ctx.device)  # (S, W, W)
        self.pos = torch.stack([s.layout[1] for s in shapes]).to(ctx.device)  # (S, W)

    def forward(self, bonus: torch.Tensor, nodes: torch.Tensor, kind: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Same contract as `TreeNoCache.forward`."""
        ctx, dev = self.ctx, self.ctx.device
        R, n, W = nodes.shape[0], nodes.shape[1] + 1, self.pos.shape[1]
        c = torch.tensor(kind, device=dev)
        masks = torch.full((R, n * self.n_masks), ctx.mask_id, dtype=torch.long, device=dev)
        ids = torch.cat([bonus[:, None], nodes, masks], dim=1)  # (R, W)
        start = torch.tensor(ctx.cursor, device=dev)
        L = max(ctx.cursor) + W
        rel = torch.arange(L, device=dev)[None] - start[:, None]  # (R, L) slot - cursor
        in_window = (rel >= 0) & (rel < W)
        window = self.pattern[c].gather(2, rel.clamp(0, W - 1)[:, None, :].expand(-1, W, -1))  # (R, W, L)
        visible = (rel < 0)[:, None, :] | (in_window[:, None, :] & window)
        ctx.cache.plan(ctx.cursor, start[:, None] + torch.arange(W, device=dev), L)
        logits = ctx.model(input_ids=ids, attention_mask=visible[:, None], position_ids=start[:, None] + self.pos[c],
                           cache=ctx.cache, use_cache=True).logits  # (R, W, V)
        ctx.cursor = [x + 1 for x in ctx.cursor]  # the root is committed
        return logits[:, :n], logits[:, n:].reshape(R, n, self.n_masks, -1)

    def keep(self, paths: list[list[int]], j: list[int]) -> None:
        """Move row i's first j[i] path nodes to the slots after its root, then commit them.

        Node v of the window sits at slot root + v; depth-first order puts the tree's top-1 chain
        (and a lookup chain) at v = depth already, so only other paths move."""
        ctx = self.ctx
        src = [[c - 1 + (v if d < a else d + 1) for d, v in enumerate(p)] for c, p, a in zip(ctx.cursor, paths, j)]
        dst = [[c + d for d in range(len(p))] for c, p in zip(ctx.cursor, paths)]
        if src != dst:
            s, t = (torch.tensor(x, device=ctx.device) for x in (src, dst))
            for buf in ctx.cache.keys + ctx.cache.values:  # (R, H, capacity, E): the active rows
                R, H, _, E = buf.shape
                buf.scatter_(2, t[:, None, :, None].expand(R, H, -1, E),
                             buf.gather(2, s[:, None, :, None].expand(R, H, -1, E)))
        ctx.cursor = [c + a for c, a in zip(ctx.cursor, j)]

    def select(self, keep: list[int]) -> None:
        self.ctx.select(keep)


def draft_shapes(cfg) -> tuple[DraftTree, list[DraftShape]]:
    """The tree of `cfg.draft_tree` and the shapes a row may take: [the tree] or, with prompt
    lookup, [the tree, the lookup chain], padded to one number of nodes."""
    M = cfg.block_size - 1
    tree = DraftTree(tuple(cfg.draft_tree), M)
    if not cfg.prompt_lookup:
        return tree, [tree.shape]
    L = cfg.lookup_policy.tokens
    N = max(tree.size, L)
    return tree, [tree.shape.padded(N), chain(L, M).padded(N)]


def window_width(cfg) -> int:
    """Slots past the cursor a forward of `cfg`'s drafts writes."""
    return draft_shapes(cfg)[1][0].width


@torch.no_grad()
def decode_tree(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int,
                ctx: NoCacheContext | CursorContext) -> Iterator[StepEvent]:
    """Greedy lossless MARS with `rows.cfg.draft_tree` on `ctx` (fresh, from `decode_exact`)."""
    cfg, dev = rows.cfg, rows.device
    M = cfg.block_size - 1
    tree, shapes = draft_shapes(cfg)
    N, k = shapes[0].size, max(tree.widths)
    policy = cfg.lookup_policy
    L = policy.tokens if policy is not None else 0
    parent = torch.stack([s.parent for s in shapes]).to(dev)  # (S, N + 1)
    depth = torch.stack([s.node_depth for s in shapes]).to(dev)
    D = max(s.depth for s in shapes)
    tctx = TreeCursor(ctx, shapes) if isinstance(ctx, CursorContext) else TreeNoCache(ctx, shapes)
    texts = [list(p) for p in rows.prompts]  # for prompt lookup
    # the first forward: the prompts and one group of masks after each (no drafts yet)
    verify, groups, _ = ctx.forward([list(p) for p in rows.prompts], [[] for _ in rows.prompts], M + 1, "all")
    R = verify.shape[0]
    kind = [0] * R
    nodes = torch.zeros(R, N, dtype=torch.long, device=dev)
    path = torch.zeros(R, D, dtype=torch.long, device=dev)
    j = torch.zeros(R, dtype=torch.long, device=dev)
    first = True
    while rows.running():
        tau, live = rows.tau(), rows.active
        if not first:
            verify, groups = tctx.forward(bonus, nodes, kind)  # (R, N + 1, V), (R, N + 1, B - 1, V)
            c = torch.tensor(kind, device=dev)
            path, j = accept_path(parent[c], depth[c], verify.argmax(dim=-1), nodes, D)
        R = verify.shape[0]
        at = torch.arange(R, device=dev)
        probs = verify.float().softmax(dim=-1)  # (R, N + 1, V)
        tokens_path = torch.cat([nodes.new_zeros(R, 1), nodes], dim=1).gather(1, path)  # (R, D); node v at column v
        if cfg.max_accept is not None:
            j = j.clamp(max=cfg.max_accept - 1)  # a confirmed node is the model's own token: emit it as the bonus
        last = torch.where(j > 0, path.gather(1, (j - 1).clamp_min(0)[:, None])[:, 0], 0)  # (R,) node before the bonus
        bonus = probs[at, last].argmax(dim=-1)  # (R,)
        parents = torch.cat([path.new_zeros(R, 1), path[:, :-1]], dim=1)  # (R, D): the node each path node follows
        path_conf = confidence(probs[at[:, None], parents], tokens_path, cfg.metric)  # (R, D)
        bonus_conf = confidence(probs[at, last][:, None], bonus[:, None], cfg.metric)
        tokens, conf, n = after_drafts(tokens_path, path_conf, j, bonus[:, None], bonus_conf, torch.ones_like(j))
        nodes = tree.node_tokens(groups[at, last].topk(k, dim=-1).indices)  # (R, tree size): the next tree
        nodes = torch.cat([nodes, nodes.new_full((R, N - nodes.shape[1]), mask_id)], dim=1)  # padding leaves
        step = rows.commit(live, tokens, conf, n, tau, torch.cat([j[:, None], path], dim=1))
        js = [int(o.extra[0]) for o in step.rows]
        paths = [[int(v) for v in o.extra[1:1 + D]] for o in step.rows]
        event = step.event
        event.verified = [0] * len(rows.prompts)
        for r, a, e in zip(live, js, step.taken):
            event.verified[r] = min(a, len(e))
        event.proposed = [list(t) for t in event.tokens]
        event.proposed_confidences = [list(c) for c in event.confidences]
        if not first:
            rows.stats.drafted += sum(N if c == 0 else L for c in kind)
            rows.stats.accepted_drafts += sum(js)
            tctx.keep(paths, js)
        first = False
        for t, e in zip(texts, step.taken):
            t.extend(e)
        keep = rows.still_active()
        tctx.select(keep)
        texts = [texts[i] for i in keep]
        idx = torch.tensor(keep, dtype=torch.long, device=dev)
        bonus, nodes = bonus[idx], nodes[idx]
        kind = [0] * len(keep)
        if cfg.prompt_lookup:  # rows whose text repeats draft the lookup chain instead
            copied = [policy.propose(t, []) for t in texts]  # (drafts, copied) per row
            kind = [int(c) for _, c in copied]
            if any(kind):
                chains = torch.tensor([d + [mask_id] * (N - len(d)) for d, _ in copied], device=dev)
                nodes = torch.where(torch.tensor(kind, dtype=torch.bool, device=dev)[:, None], chains, nodes)
        yield event
