"""What an exact step drafts: per row, a shape and its tokens, planned from the last step's masks.

After a step, the group of B - 1 masks that stood after the accepted path's last node predicts the
next B - 1 tokens; the step hands their top-k ids and probabilities to the host (`Candidates`).
A planner turns them, and the row's text (prompt lookup), into the next step's drafts (`Plan`):

- `chain_plan`: lossless MARS's own top-1 chain, with a group after every accept count ("all"),
  after the last draft ("last") or after none and the last ("ends");
- `tree_plan`: the top-k_d candidates at distance d in every combination (`DraftTree`), a group
  after every node;
- `budget_plan`: the `nodes` candidate paths most likely to be accepted (the masks' joint
  probabilities; a prompt-lookup chain's tokens at a fixed prior, merged where they agree), and
  `groups` groups after the nodes most likely to end the accepted path (EAGLE-2's lesson: the
  same weights accept more when the tree follows the confidences). The budget is what a forward
  of 1 + nodes + groups (B - 1) positions costs on the machine (`fastest_exact`).

With a lookup policy, the chain and the tree give way to the copied chain where the text repeats.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from .lookup import LookupPolicy
from .tree import DraftShape, DraftTree, chain

# the acceptance a budget plan assumes per prompt-lookup draft (d-th draft: LOOKUP_PRIOR ** d): a
# prior, not a calibration; where it misleads, `fastest_exact`'s replay sees it in the forwards
LOOKUP_PRIOR = 0.6


@dataclass(frozen=True)
class Candidates:
    """One row's mask predictions after its accepted path: top-k ids and probabilities per
    distance (B - 1 lists of k), or none (the path ended where no group stood)."""

    ids: tuple[tuple[int, ...], ...] = ()
    probs: tuple[tuple[float, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ids)


@dataclass(frozen=True)
class Plan:
    """A row's drafts: the shape (explicit groups), its N node tokens, whether they were copied."""

    shape: DraftShape
    tokens: tuple[int, ...]
    copied: bool = False


def chain_plan(cands: Candidates, n_masks: int, layout: str) -> Plan:
    """The masks' top-1 chain and the groups of `layout` ("all", "last", "ends")."""
    drafts = tuple(ids[0] for ids in cands.ids)
    return Plan(chain(len(drafts), n_masks, chain_groups(len(drafts), layout)), drafts)


def chain_groups(k: int, layout: str) -> tuple[int, ...]:
    """The nodes of a k-draft chain a group stands after: every one, the last, or the root and the last."""
    if layout == "all":
        return tuple(range(k + 1))
    if layout == "ends":
        return (0, k) if k else (0,)
    return (k,)


def tree_plan(cands: Candidates, tree: DraftTree) -> Plan:
    """The tree's nodes filled from the candidates (no candidates: no drafts), a group after each."""
    if not cands:
        return Plan(chain(0, tree.n_masks, (0,)), ())
    tokens = tuple(cands.ids[len(node) - 1][node[-1]] for node in tree.nodes)
    return Plan(DraftShape(tree.shape.parents, tree.n_masks, tuple(range(tree.size + 1))), tokens)


def budget_plan(cands: Candidates, n_masks: int, nodes: int, groups: int, copied: list[int] = ()) -> Plan:
    """The `nodes` most likely paths and `groups` groups after the likeliest ends (see the module)."""
    likely: dict[tuple[int, ...], float] = {}
    # best first: the candidates of each distance are sorted, so a path's likelier relatives are its
    # parent and its elder sibling; popping `nodes` times gives the `nodes` likeliest paths
    heap = [(-cands.probs[0][0], (0,))] if cands else []
    while heap and len(likely) < nodes:
        p, ranks = heapq.heappop(heap)
        likely[tuple(cands.ids[d][r] for d, r in enumerate(ranks))] = -p
        d, r = len(ranks) - 1, ranks[-1]
        if d + 1 < len(cands.ids):  # the first child
            heapq.heappush(heap, (p * cands.probs[d + 1][0], ranks + (0,)))
        if r + 1 < len(cands.ids[d]):  # the next sibling
            heapq.heappush(heap, (p / max(cands.probs[d][r], 1e-30) * cands.probs[d][r + 1], ranks[:-1] + (r + 1,)))
    for d in range(1, len(copied) + 1):  # a copied path: the prior, or the masks' estimate if higher
        path = tuple(copied[:d])
        likely[path] = max(likely.get(path, 0.0), LOOKUP_PRIOR ** d)
    # most likely first; a path is never likelier than its parent, and ties go to the shorter one,
    # so the chosen set holds every chosen node's parent
    chosen = sorted(sorted(likely, key=lambda t: (-likely[t], len(t)))[:nodes])  # pre-order
    index = {path: v for v, path in enumerate(chosen, start=1)}
    parents = tuple(index.get(path[:-1], 0) for path in chosen)
    # the chance that the accepted path ends at a node: it is accepted, none of its children is
    ends = [1.0] + [likely[p] for p in chosen]
    for v, path in enumerate(chosen, start=1):
        ends[parents[v - 1]] -= likely[path]
    order = sorted(range(len(ends)), key=lambda v: -ends[v])[:groups]
    shape = DraftShape(parents, n_masks, tuple(sorted(order)))
    return Plan(shape, tuple(p[-1] for p in chosen), copied=bool(copied) and tuple(copied[:1]) in index)


def budget(cfg) -> tuple[int, int, int, int]:
    """(N, G, D, k) of a config's steps after the first: nodes and groups a window holds at most,
    the deepest node, and the candidates read per mask."""
    M = cfg.block_size - 1
    lookup = cfg.lookup_policy.tokens if cfg.prompt_lookup else 0
    if cfg.draft_budget is not None:
        N, G = cfg.draft_budget
        return N, G, max(M, lookup, 1), min(8, max(N, 1))
    if cfg.draft_tree is not None:
        tree = DraftTree(tuple(cfg.draft_tree), M)
        N = max(tree.size, lookup)
        return N, N + 1, max(len(tree.widths), lookup, 1), max(tree.widths)
    N = max(M, lookup)
    return N, (N + 1 if cfg.draft_groups == "all" else 2 if cfg.draft_groups == "ends" else 1), max(N, 1), 1


def step_size(plans: list[Plan], cfg, static: bool) -> tuple[int, int]:
    """(N, G) of one step's window: the largest plan's nodes and groups; for a compiled step the
    smallest of a few sizes that holds them (the config's kinds of drafts, groups in powers of
    two), so that a graph is traced per kind of step, not per step."""
    n = max(p.shape.size for p in plans)
    g = max(len(p.shape.group_nodes) for p in plans)
    if not static:
        return n, g
    return min(b for b in node_buckets(cfg) if b >= n), min(b for b in group_buckets(cfg) if b >= g)


def node_buckets(cfg) -> tuple[int, ...]:
    """The numbers of nodes a compiled step may hold: each kind of draft this config makes."""
    M = cfg.block_size - 1
    sizes = {M, budget(cfg)[0]}
    if cfg.prompt_lookup:
        sizes.add(cfg.lookup_policy.tokens)
    if cfg.draft_tree is not None:
        sizes.add(DraftTree(tuple(cfg.draft_tree), M).size)
    return tuple(sorted(sizes))


def group_buckets(cfg) -> tuple[int, ...]:
    """The numbers of groups a compiled step may hold: none (every row copied and keeps no masks
    after it), one, the ends, one after every node of each kind of draft, the budget's."""
    sizes = {0, 1, 2, budget(cfg)[1]} | {n + 1 for n in node_buckets(cfg)}
    return tuple(sorted(sizes))


def lookahead(cfg) -> int:
    """Positions past the committed text one forward may use (the context check): the root, the
    deepest node, a group of B - 1 masks after it."""
    return 1 + budget(cfg)[2] + cfg.block_size - 1


def window_slots(cfg) -> int:
    """Cache slots past the committed text one step may write: its widest window."""
    N, G, _, _ = budget(cfg)  # no step holds more (a compiled step's sizes are buckets up to these)
    return 1 + N + G * (cfg.block_size - 1)


class Planner:
    """The drafts of one decode's rows, step after step: the config's kind of plan, and prompt
    lookup (from each row's text: prompt and output so far) where a policy says so."""

    def __init__(self, cfg):
        self.M = cfg.block_size - 1
        self.policy: LookupPolicy | None = cfg.lookup_policy
        self.layout = cfg.draft_groups
        self.tree = DraftTree(tuple(cfg.draft_tree), self.M) if cfg.draft_tree else None
        self.budget = cfg.draft_budget

    def first(self) -> Plan:
        """The first forward's drafts: none; one group after the prompt's last token."""
        return Plan(chain(0, self.M, (0,)), ())

    def plan(self, cands: Candidates, text: list[int], was_copied: bool) -> Plan:
        """A row's next drafts from its candidates, its text and whether its last drafts were copied."""
        if self.policy is not None and was_copied and not self.policy.masks_after_copy:
            cands = Candidates()  # the masks after a copied chain are dropped
        if self.budget is not None:
            copied = self.policy.propose(text, [])[0] if self.policy is not None else []
            return budget_plan(cands, self.M, *self.budget, copied)
        if self.policy is not None:
            drafts, copied = self.policy.propose(text, [])
            if copied:
                if self.tree is not None:
                    groups = tuple(range(len(drafts) + 1))
                else:
                    groups = chain_groups(len(drafts), self.layout) if self.policy.masks_after_copy else ()
                return Plan(chain(len(drafts), self.M, groups), tuple(drafts), copied=True)
        if self.tree is not None:
            return tree_plan(cands, self.tree)
        return chain_plan(cands, self.M, self.layout)
