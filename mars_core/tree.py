"""A draft tree for lossless MARS: the top-k mask predictions at each distance, every combination.

One group of B - 1 masks predicts the B - 1 tokens after the next one. Lossless MARS drafts their
top-1 (a chain); a tree with widths (k_1, .., k_D) drafts the top-k_d candidates at distance d in
every combination (k_1 + k_1 k_2 + .. nodes), so a draft whose first guess was wrong can still be
accepted through its second. The masks of a group do not see each other's choice, so a node's
token depends only on its depth and rank: node (r_1, .., r_d) is the r_d-th candidate at
distance d.

Nodes are numbered in depth-first pre-order, 1..N, with 0 the root (the last real token), so
the top-1 chain is nodes 1..D and its key/values already sit where an accepted chain belongs.
For widths (2, 1):

    root 0 ── 1 (rank 0) ── 2 (rank 0)
           └─ 3 (rank 1) ── 4 (rank 0)

A verifying forward carries, after the root, every node (it sees its ancestors only) and a
group of B - 1 masks after the root and after every node (it sees that node's path only), so
whichever path is accepted, the group after its last node holds the next step's candidates:

    window   0 | 1 2 3 4 | M M M (after 0) | M M M (after 1) | ... | M M M (after 4)
    position 0 | 1 2 1 2 | 1 2 3           | 2 3 4           | ... | 3 4 5

Any shape given by its parents works the same way (`DraftShape`): the tree, or a chain of
prompt-lookup drafts (`chain`), which a row takes instead where its text repeats.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import torch

MAX_TREE_NODES = 64  # beyond this only the forward widens: the deepest candidates are rarely right


@dataclass(frozen=True)
class DraftShape:
    """Drafts as a tree given by its parents: node v (1..N) follows `parents[v - 1]` (0 = the
    root), every parent numbered before its children; a group of `n_masks` masks after each node
    of `groups` (None: after the root and after every node). A chain is a one-wide tree: lossless
    MARS's own drafts with groups after every accept count ("all") or after its last draft only
    ("last"), and a prompt-lookup chain, differ only in how they are filled.

    `window(prefix)` is the one window builder of the exact modes: the cursor decoders, the
    compiled step, the replay oracle and the gated training layout all read their attention
    pattern and positions from it."""

    parents: tuple[int, ...]
    n_masks: int  # B - 1
    groups: tuple[int, ...] | None = None

    def __post_init__(self):
        if any(not 0 <= p <= v for v, p in enumerate(self.parents)):
            raise ValueError(f"a node's parent must come before it: {self.parents}")
        if self.groups is not None and any(not 0 <= g <= len(self.parents) for g in self.groups):
            raise ValueError(f"a group stands after a node 0..{len(self.parents)}: {self.groups}")

    @property
    def size(self) -> int:
        """N, the draft tokens a forward verifies."""
        return len(self.parents)

    @property
    def group_nodes(self) -> tuple[int, ...]:
        """The node each group stands after, in window order."""
        return tuple(range(self.size + 1)) if self.groups is None else self.groups

    @property
    def width(self) -> int:
        """W, the tokens of a verifying forward: the root, N nodes, the groups' masks."""
        return 1 + self.size + len(self.group_nodes) * self.n_masks

    @cached_property
    def parent(self) -> torch.Tensor:
        """(N + 1,) long: each node's parent (the root's is itself)."""
        return torch.tensor((0,) + self.parents)

    @cached_property
    def node_depth(self) -> torch.Tensor:
        """(N + 1,) long: 0 for the root, d for a node at distance d."""
        depth = [0]
        for p in self.parents:
            depth.append(depth[p] + 1)
        return torch.tensor(depth)

    @property
    def depth(self) -> int:
        return int(self.node_depth.max())

    @cached_property
    def ancestry(self) -> torch.Tensor:
        """(N + 1, N + 1) bool: [v, w] is True where w is v or one of its ancestors (root included)."""
        n = self.size + 1
        anc = torch.eye(n, dtype=torch.bool)
        for v, p in enumerate(self.parents, start=1):
            anc[v] |= anc[p]
        return anc

    @property
    def layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`window(0)`: pattern (W, W) and positions (W,) from the root's."""
        return self.window(0)

    @functools.lru_cache(maxsize=256)
    def window(self, prefix: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """pattern (P + W, P + W) bool (query, key) and rel_pos (P + W,) long (positions from the
        window's first slot) of `prefix` = P new real tokens (causal; the prompt, at the first
        forward), the root, nodes 1..N, then each group of B - 1 masks. A node sees the prefix and
        its ancestors; a group sees the prefix, the path of the node it follows and its own
        earlier masks."""
        n, M, P = self.size + 1, self.n_masks, prefix
        nodes = torch.tensor(self.group_nodes, dtype=torch.long)
        W = self.width
        i = torch.arange(W)
        is_node = i < n  # root and nodes
        g = torch.div((i - n).clamp_min(0), max(M, 1), rounding_mode="floor")  # group slot
        m = (i - n).clamp_min(0) - g * M  # 0..M-1 inside the group
        u = nodes[g.clamp(max=max(len(nodes) - 1, 0))] if len(nodes) else torch.zeros_like(i)  # the node it follows
        of = torch.where(is_node, i, u)  # the node whose path a slot sees
        pos = torch.where(is_node, self.node_depth[i.clamp(max=n - 1)], self.node_depth[u.clamp(max=n - 1)] + 1 + m)
        sees_node = is_node[None, :] & self.ancestry[of][:, i.clamp(max=n - 1)]  # (W, W)
        own_group = ~is_node[:, None] & ~is_node[None, :] & (g[:, None] == g[None, :]) & (i[:, None] >= i[None, :])
        pattern = torch.zeros(P + W, P + W, dtype=torch.bool)
        pattern[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
        pattern[P:, :P] = True
        pattern[P:, P:] = sees_node | own_group
        return pattern, torch.cat([torch.arange(P), P + pos])

    def padded(self, size: int, n_groups: int | None = None) -> DraftShape:
        """The same shape with extra leaves under the root up to `size` nodes (and, with explicit
        groups, extra groups after the root up to `n_groups`), so that rows of two shapes share
        one window. A leaf whose token the model predicts would be accepted like any draft: the
        output stays the model's own; an extra group is never read (the first group after the
        accepted path's last node is)."""
        groups = self.groups
        if groups is not None and n_groups is not None:
            groups = groups + (0,) * (n_groups - len(groups))
        elif groups is None and n_groups is not None:
            raise ValueError("only a shape with explicit groups pads its groups")
        return DraftShape(self.parents + (0,) * (size - self.size), self.n_masks, groups)


def stack_windows(shapes: list[DraftShape], prefixes: list[int],
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Row i's `shapes[i].window(prefixes[i])`, right-padded to one width W: pattern (R, W, W)
    (a padding slot sees itself only, and nothing sees it) and rel_pos (R, W) (a padding slot's
    position is its column: in range, never read)."""
    W = max(p + s.width for s, p in zip(shapes, prefixes))
    pattern = torch.eye(W, dtype=torch.bool).repeat(len(shapes), 1, 1)
    pos = torch.arange(W).repeat(len(shapes), 1)
    for r, (s, p) in enumerate(zip(shapes, prefixes)):
        pat, rel = s.window(p)
        w = len(rel)
        pattern[r, :w, :w] = pat
        pos[r, :w] = rel
    return pattern.to(device), pos.to(device)


def chain(length: int, n_masks: int, groups: tuple[int, ...] | None = None) -> DraftShape:
    """A chain of `length` drafts (lossless MARS's own, prompt lookup's): node v follows v - 1."""
    return DraftShape(tuple(range(length)), n_masks, groups)


@dataclass(frozen=True)
class DraftTree:
    """The top-k_d mask candidates at distance d, every combination, widths (k_1, .., k_D)."""

    widths: tuple[int, ...]
    n_masks: int  # B - 1

    def __post_init__(self):
        if not self.widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.widths):
            raise ValueError(f"draft tree widths must be integers >= 1, one per distance; got {self.widths!r}")
        if len(self.widths) > self.n_masks:
            raise ValueError(f"a draft tree of depth {len(self.widths)} needs block_size >= {len(self.widths) + 1} "
                             f"(one mask per distance); block_size is {self.n_masks + 1}")

    @cached_property
    def nodes(self) -> tuple[tuple[int, ...], ...]:
        """Every node as its ranks (r_1, .., r_d), depth-first pre-order."""
        out: list[tuple[int, ...]] = []

        def visit(prefix: tuple[int, ...]) -> None:
            if len(prefix) == len(self.widths):
                return
            for r in range(self.widths[len(prefix)]):
                out.append(prefix + (r,))
                visit(prefix + (r,))

        visit(())
        return tuple(out)

    @cached_property
    def shape(self) -> DraftShape:
        index = {n: i + 1 for i, n in enumerate(self.nodes)}
        return DraftShape(tuple(index.get(n[:-1], 0) for n in self.nodes), self.n_masks)

    @property
    def size(self) -> int:
        return len(self.nodes)

    def node_tokens(self, tops: torch.Tensor) -> torch.Tensor:
        """tops (R, B - 1, k) long, the top-k ids of each mask of a group (k >= max width) -> (R, N):
        the token of every node."""
        d = torch.tensor([len(n) - 1 for n in self.nodes], device=tops.device)
        r = torch.tensor([n[-1] for n in self.nodes], device=tops.device)
        return tops[:, d, r]


def accept_path(parent: torch.Tensor, depth: torch.Tensor, pred: torch.Tensor, tokens: torch.Tensor,
                D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The longest path of drafts the model's own predictions confirm (greedy verification).

    parent, depth (R, N + 1) long: each row's shape (`DraftShape.parent`, `.node_depth`), D: its
    deepest node; pred (R, N + 1) long: the argmax at the root and at every node; tokens (R, N):
    the nodes' tokens. A node is accepted when its parent is and its token is the parent's
    prediction. Siblings hold distinct tokens except padding leaves (`DraftShape.padded`), which
    come after every real node and have no children: where several nodes of a depth are
    accepted the first counts, and it is the one deeper nodes descend from. Returns path (R, D)
    long: the accepted node at each depth (0 past the last), and j (R,): how many.
    """
    tok = torch.cat([pred[:, :1], tokens], dim=1)  # (R, N + 1); the root's slot is never compared
    match = tok == pred.gather(1, parent)  # (R, N + 1)
    acc = torch.zeros_like(match)
    acc[:, 0] = True
    for d in range(1, D + 1):  # parents come a level earlier
        acc |= (depth == d) & match & acc.gather(1, parent)
    levels = torch.arange(1, D + 1, device=pred.device)[None, :, None]
    level = acc[:, None, :] & (depth[:, None, :] == levels)  # (R, D, N + 1)
    # accepted depths are 1..j (a node needs its parent), so the path is the first node of each
    return level.long().argmax(dim=2), level.any(dim=2).sum(dim=1)


def parse_trees(text: str) -> list[tuple[int, ...]]:
    """"2,1,1 2,2,1" -> [(2, 1, 1), (2, 2, 1)]; a ValueError that shows the form otherwise."""
    trees = []
    for part in text.split():
        try:
            widths = tuple(int(x) for x in part.split(","))
        except ValueError:
            widths = ()
        if not widths or min(widths) < 1:
            raise ValueError(f"{part!r} is not a list of draft tree widths >= 1 such as 2,1,1")
        trees.append(widths)
    return trees
