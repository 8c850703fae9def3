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

from dataclasses import dataclass
from functools import cached_property

import torch

MAX_TREE_NODES = 64  # beyond this only the forward widens: the deepest candidates are rarely right


@dataclass(frozen=True)
class DraftShape:
    """Drafts as a tree given by its parents: node v (1..N) follows `parents[v - 1]` (0 = the
    root), every parent numbered before its children; a group of `n_masks` masks after the root
    and after every node."""

    parents: tuple[int, ...]
    n_masks: int  # B - 1

    def __post_init__(self):
        if any(not 0 <= p <= v for v, p in enumerate(self.parents)):
            raise ValueError(f"a node's parent must come before it: {self.parents}")

    @property
    def size(self) -> int:
        """N, the draft tokens a forward verifies."""
        return len(self.parents)

    @property
    def width(self) -> int:
        """W, the tokens of a verifying forward: the root, N nodes, N + 1 groups."""
        return 1 + self.size + (self.size + 1) * self.n_masks

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

    @cached_property
    def layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """pattern (W, W) bool (query, key inside the window) and rel_pos (W,) long: positions
        from the root's. Window: root, nodes 1..N, then group u (u = 0..N) of B - 1 masks."""
        n, M = self.size + 1, self.n_masks
        W = self.width
        i = torch.arange(W)
        is_node = i < n  # root and nodes
        u = torch.div((i - n).clamp_min(0), M, rounding_mode="floor")  # the node a group slot stands after
        m = (i - n).clamp_min(0) - u * M  # 0..M-1 inside the group
        of = torch.where(is_node, i, u)  # the node whose path a slot sees
        pos = torch.where(is_node, self.node_depth[i.clamp(max=n - 1)], self.node_depth[u.clamp(max=n - 1)] + 1 + m)
        sees_node = is_node[None, :] & self.ancestry[of][:, i.clamp(max=n - 1)]  # (W, W)
        own_group = ~is_node[:, None] & ~is_node[None, :] & (u[:, None] == u[None, :]) & (i[:, None] >= i[None, :])
        return sees_node | own_group, pos

    def padded(self, size: int) -> DraftShape:
        """The same shape with extra leaves under the root up to `size` nodes, so that rows of two
        shapes share one window. A leaf whose token the model predicts would be accepted like any
        draft: the output stays the model's own."""
        return DraftShape(self.parents + (0,) * (size - self.size), self.n_masks)


def chain(length: int, n_masks: int) -> DraftShape:
    """A chain of `length` drafts (prompt lookup's): node v follows v - 1."""
    return DraftShape(tuple(range(length)), n_masks)


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
