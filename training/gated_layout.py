"""The training layout of a mask-gated MARS fine-tune: groups of masks on a cached clean pass.

With the gate (`mars_core.gate`), every real token computes exactly the base, so the clean
sequence needs no gradient: one no-grad forward gives every layer's keys and values and the base's
own next-token distribution at every position. Only the masks are trained. A *group* is what
decoding appends after a last real token at position p: B - 1 masks at positions p+1 .. p+B-1,
mask j predicting token p+j+1 (distance j+1 from p: the AR head predicts distance 1 itself):

    clean  x0 x1 ... xp  x(p+1) x(p+2) ...          keys and values of the base (no graph)
    group               M      M      M             queries: see x0..xp and the group's masks
                        ->x(p+2) ->x(p+3) ->x(p+4)  before them (causal inside the group)

Unlike the paper's block layout (a group only after every B-th position), a group can follow any
response position, so one clean pass feeds as many groups as the step can afford (`anchors`).
Each group's queries sit at positions p+1 .. and attend the cached clean keys up to p: exactly
the window of a cursor decoder at that point of the text.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Groups(NamedTuple):
    ids: torch.Tensor  # (1, M) the mask id, M = masks in all groups
    pos: torch.Tensor  # (1, M) position ids, p + j
    mask: torch.Tensor  # (1, 1, M, n + M) bool: clean keys 0..p, then the group's own masks 1..j
    targets: torch.Tensor  # (M,) token ids x[p + j + 1]
    source: torch.Tensor  # (M,) clean position whose base distribution predicts the same token: p + j
    distance: torch.Tensor  # (M,) j + 1


def anchors(start: int, n: int, count: int | None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Last-real positions p for groups: p in [start - 1, n - 3] (the last prompt token through the
    last position that leaves a mask a target), all of them or `count` drawn without replacement."""
    p = torch.arange(start - 1, n - 2)
    if count is not None and count < len(p):
        p = p[torch.randperm(len(p), generator=generator)[:count]].sort().values
    return p


def group_layout(anchor: torch.Tensor, n: int, block_size: int, mask_id: int,
                 max_distance: int | None = None, far_keep: float = 1.0,
                 generator: torch.Generator | None = None) -> Groups:
    """The masks after each anchor (distance 2 .. min(B, max_distance), targets inside the text).

    far_keep < 1 makes far masks cheaper (PARD's subsampling): each mask after the first is kept
    with that chance if the one before it was, so a group ends early (distance 3 is in a share
    far_keep of the groups, distance 4 in far_keep ** 2) and stays what decoding appends."""
    top = block_size if max_distance is None else min(block_size, max_distance)
    j = torch.arange(1, top)  # mask j predicts distance j + 1
    pos = (anchor[:, None] + j[None]).reshape(-1)  # (M,)
    group = torch.arange(len(anchor))[:, None].expand(-1, len(j)).reshape(-1)
    jj = j[None].expand(len(anchor), -1).reshape(-1)
    keep = pos + 1 <= n - 1  # a target exists
    if far_keep < 1:
        drawn = torch.rand(len(anchor), len(j) - 1, generator=generator) < far_keep  # (G, J - 1)
        alive = torch.cat([torch.ones(len(anchor), 1, dtype=torch.bool), drawn.cumprod(1).bool()], 1)  # (G, J)
        keep &= alive.reshape(-1)
    pos, group, jj = pos[keep], group[keep], jj[keep]
    M = len(pos)
    last_real = anchor[group]  # (M,)
    clean = torch.arange(n)[None] <= last_real[:, None]  # (M, n)
    own = (group[:, None] == group[None]) & (jj[None] <= jj[:, None])  # (M, M) causal inside a group
    mask = torch.cat([clean, own], dim=1)
    return Groups(ids=torch.full((1, M), mask_id), pos=pos[None], mask=mask[None, None],
                  targets=None, source=pos, distance=jj + 1)


def with_targets(g: Groups, ids: torch.Tensor) -> Groups:
    """Fill the hard targets from the example's ids (1-D)."""
    return g._replace(targets=ids[g.source + 1])
