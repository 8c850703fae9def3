"""Verifying drafts exactly: the token-level rule of speculative decoding, on tensors.

A step has, per sequence, `k` drafts d_1..d_k (k <= K, padded to K) with the distributions
q_1..q_k they were drawn from, and the target's K + 1 next-token predictions p_1..p_{K+1}:
p_i is read at the token before d_i (the last real token for i = 1), so it is exactly the
AR prediction for d_i's position given the prefix and d_1..d_{i-1}.

- greedy (temperature 0): accept while d_i == argmax p_i; the bonus is argmax p_{j+1}.
- sampling: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection
  the token is drawn from normalise(max(0, p_i - q_i)), after k acceptances from p_{k+1}
  (Leviathan et al. 2023, Chen et al. 2023). Every emitted token is then distributed exactly as
  AR sampling from p, whatever q is, as long as d_i really was drawn from q_i.

Either way j (the accepted count) is a cumulative product over the drafts: one tensor op for
the batch, no host sync. The randomness comes in as arguments (`uniform`, `gumbel`), drawn
per sequence by the caller, so that a batch row decides exactly what it decides alone.
"""
from __future__ import annotations

import torch

from .acceptance import choose_tokens, confidence, passes


def verify_drafts(drafts: torch.Tensor, n_drafts: torch.Tensor, q: torch.Tensor | None,
                  logits: torch.Tensor, temperature: float, uniform: torch.Tensor | None = None,
                  gumbel: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accept a prefix of the drafts and pick the token after it.

    drafts (R, K) long, padded past n_drafts (R,); q (R, K, V) the draft distributions (None when
    greedy); logits (R, K + 1, V) the target's predictions p_1..p_{K+1}; uniform (R, K) and
    gumbel (R, V) uniform noise in [0, 1) (sampling only).
    Returns j (R,) accepted drafts, bonus (R,) the token after them, probs (R, K + 1, V) the
    (tempered) target distributions.
    """
    R, K = drafts.shape
    valid = torch.arange(K, device=drafts.device)[None] < n_drafts[:, None]  # (R, K)
    rows = torch.arange(R, device=drafts.device)
    if temperature == 0:
        probs = torch.softmax(logits.float(), dim=-1)
        target = logits.argmax(dim=-1)  # (R, K + 1)
        ok = (drafts == target[:, :K]) & valid
        j = ok.long().cumprod(dim=1).sum(dim=1)
        return j, target[rows, j], probs
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (R, K + 1, V)
    if K == 0:
        j = torch.zeros(R, dtype=torch.long, device=drafts.device)
        return j, _gumbel_pick(probs[:, 0], gumbel), probs
    p_d = probs[:, :K].gather(-1, drafts[..., None])[..., 0]  # (R, K)
    q_d = q.gather(-1, drafts[..., None])[..., 0]
    ok = (uniform * q_d < p_d) & valid  # u < p / q, i.e. probability min(1, p / q)
    j = ok.long().cumprod(dim=1).sum(dim=1)
    p_next = probs[rows, j]  # (R, V)
    q_next = q[rows, j.clamp(max=K - 1)]
    residual = (p_next - q_next).clamp_min(0)
    # p == q leaves no residual; a rejection then has probability 0, so any choice is exact
    usable = (j < n_drafts) & (residual.sum(dim=-1) > 0)
    dist = torch.where(usable[:, None], residual, p_next)
    return j, _gumbel_pick(dist, gumbel), probs


def _gumbel_pick(dist: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """One draw per row from the (unnormalised) distribution `dist` (R, V) by the Gumbel-max trick."""
    g = -torch.log(-torch.log(gumbel.clamp_min(1e-20)))
    return (torch.log(dist) + g).argmax(dim=-1)


def block_after(bonus: torch.Tensor, verify_probs: torch.Tensor, group_logits: torch.Tensor, tau: float,
                metric: str, temperature: float, noise: torch.Tensor | None,
                max_accept: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MARS block after the accepted drafts: the bonus, then tau-accepted mask predictions.

    bonus (R,); verify_probs (R, V) the target distribution the bonus came from; group_logits
    (R, B - 1, V) the mask predictions of the group after the accepted drafts; noise (R, B - 1, V).
    Returns tokens (R, B), conf (R, B), n (R,) with 1 <= n <= B (or max_accept): the bonus is
    always taken, then predictions while their confidence passes `tau` (left to right).
    """
    tokens, probs = choose_tokens(group_logits, temperature, noise)  # (R, B - 1), (R, B - 1, V)
    tokens = torch.cat([bonus[:, None], tokens], dim=1)  # (R, B)
    probs = torch.cat([verify_probs[:, None], probs], dim=1)
    conf = confidence(probs, tokens, metric)
    ok = passes(conf, tau, metric)
    ok[:, 0] = True
    n = ok.long().cumprod(dim=1).sum(dim=1)
    if max_accept is not None:
        n = n.clamp(max=max_accept)
    return tokens, conf, n


def after_drafts(drafts: torch.Tensor, draft_conf: torch.Tensor, j: torch.Tensor,
                 block: torch.Tensor, block_conf: torch.Tensor,
                 n_block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Emitted tokens: the j accepted drafts, then the first n_block tokens of the block.

    drafts, draft_conf (R, K); j (R,); block, block_conf (R, B); n_block (R,). Returns tokens and conf (R, K + B) and
    the emitted count j + n_block (R,).
    """
    R, K = drafts.shape
    if K == 0:
        return block, block_conf, n_block
    B = block.shape[1]
    idx = torch.arange(K + B, device=drafts.device)[None].expand(R, -1)  # (R, K + B)
    from_draft = idx < j[:, None]
    in_block = (idx - j[:, None]).clamp(0, B - 1)
    in_draft = idx.clamp(max=K - 1)
    tokens = torch.where(from_draft, drafts.gather(1, in_draft), block.gather(1, in_block))
    conf = torch.where(from_draft, draft_conf.gather(1, in_draft), block_conf.gather(1, in_block))
    return tokens, conf, j + n_block


def draft_confidence(probs: torch.Tensor, drafts: torch.Tensor, metric: str) -> torch.Tensor:
    """probs (R, K + 1, V) the target's distributions, drafts (R, K) -> (R, K): the target's
    confidence in each draft (what a UI shows next to it)."""
    K = drafts.shape[1]
    return confidence(probs[:, :K], drafts, metric)
