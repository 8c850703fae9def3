"""Confidence-based, left-to-right acceptance of a block of predictions.

Given the logits of the `B` predictions of one forward, pick a token at every position (greedy
or sampled), score each with a confidence, and accept the longest prefix whose confidences all
pass `tau`; the first prediction is always accepted (it is the ordinary AR prediction). The
whole block is handled with tensor ops: the accepted count is the sum of a cumulative product.

`repeat_guard` adds one condition to that product: a mask's token equal to the token before it
in the block is not accepted (the next forward's AR head decides that position). Masks confuse
their target with their neighbour's ("9 times 9 is 88"); on the mask-gated SmolLM2 most of the
known answers tau lost were such repeats (docs/smollm2.md, "The repeat guard").
"""
from __future__ import annotations

import torch

from .config import check_tau


def choose_tokens(logits: torch.Tensor, temperature: float,
                  noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a token per position and return (tokens, probs).

    logits: (N, B, V). temperature 0 is greedy. For sampling, `noise` is (N, B, V) uniform in
    (0, 1) and the token is drawn by the Gumbel-max trick, so each sequence can own its random
    stream (see `decoding.RowRandom`) and a batch samples exactly what each row would alone.
    Returns tokens (N, B) long and probs (N, B, V) float32 of the (tempered) distribution.
    """
    logits = logits.float()
    if temperature == 0:
        probs = torch.softmax(logits, dim=-1)
        return logits.argmax(dim=-1), probs
    if noise is None:
        raise ValueError("sampling (temperature > 0) needs uniform noise of the logits' shape")
    scaled = logits / temperature
    probs = torch.softmax(scaled, dim=-1)
    gumbel = -torch.log(-torch.log(noise.clamp_min(1e-20)))
    return (scaled + gumbel).argmax(dim=-1), probs


def confidence(probs: torch.Tensor, tokens: torch.Tensor, metric: str) -> torch.Tensor:
    """(N, B) confidence of each chosen token under `metric`."""
    if metric == "probability":
        return probs.gather(-1, tokens[..., None]).squeeze(-1)
    if metric == "entropy":
        return -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    if metric == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    raise ValueError(f"unknown metric {metric!r}")


def passes(conf: torch.Tensor, tau: float | torch.Tensor, metric: str) -> torch.Tensor:
    """(N, B) bool: does each confidence pass `tau`?

    The strictest threshold (1 for probability / margin, 0 for entropy) passes nothing, so it
    decodes exactly one token per step even when a saturated softmax reports p == 1.0.
    `tau` is a number, or a tensor (N,) of one threshold per sequence (a continuous batch mixes
    requests at different tau); either way it is compared in the confidences' dtype.
    """
    loose = tau > 0 if metric == "entropy" else tau < 1
    if isinstance(tau, torch.Tensor):
        tau, loose = tau.to(conf.dtype)[:, None], loose[:, None]
    return (conf <= tau if metric == "entropy" else conf >= tau) & loose


def accept(
    logits: torch.Tensor,
    tau: float | torch.Tensor,
    metric: str = "probability",
    temperature: float = 0.0,
    noise: torch.Tensor | None = None,
    max_accept: int | None = None,
    repeat_guard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-to-right acceptance over a block.

    logits: (N, B, V) predictions for the B next positions of N sequences.
    tau: a number, or (N,) float64 per-sequence thresholds the caller has checked.
    repeat_guard: a prediction equal to the one before it stops the accepted prefix there.
    Returns tokens (N, B), conf (N, B) and n_accept (N,) with 1 <= n_accept <= B (or max_accept).
    """
    if not isinstance(tau, torch.Tensor):
        tau = check_tau(tau, metric)
    tokens, probs = choose_tokens(logits, temperature, noise)  # (N, B), (N, B, V)
    conf = confidence(probs, tokens, metric)  # (N, B)
    ok = passes(conf, tau, metric)
    if repeat_guard:
        ok[:, 1:] &= tokens[:, 1:] != tokens[:, :-1]
    ok[:, 0] = True  # the first prediction is the AR one: always taken
    n_accept = ok.long().cumprod(dim=1).sum(dim=1)  # (N,)
    if max_accept is not None:
        n_accept = n_accept.clamp(max=max_accept)
    return tokens, conf, n_accept
