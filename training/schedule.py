"""The data order and learning rate of the CPU stages (`training.frozen_stage`, `training.gated_stage`).

An epoch is a fresh shuffle of the examples cut into ceil(examples / accum) batches, the last one
short when accum does not divide the examples, so `epochs` epochs are exactly
`ceil(epochs * steps_per_epoch)` optimizer steps and the step alone says which examples it trains
on: a resumed run needs nothing else to continue the same order.
"""
from __future__ import annotations

import math
import random


def steps_per_epoch(examples: int, accum: int) -> int:
    return math.ceil(examples / accum)


def batch_at(step: int, examples: int, accum: int, seed: int) -> list[int]:
    """The example indices of optimizer step `step`: each epoch a fresh shuffle cut into
    ceil(examples / accum) batches (the last one short), so `epochs` epochs are exactly
    `epochs * steps_per_epoch` steps and a resume needs the step alone."""
    per = steps_per_epoch(examples, accum)
    epoch, i = divmod(step, per)
    order = list(range(examples))
    random.Random(seed + epoch).shuffle(order)
    return order[i * accum:(i + 1) * accum]


def total_steps(epochs: float, examples: int, accum: int) -> int:
    """Optimizer steps of `epochs` epochs (a fraction of an epoch rounds up to a whole step)."""
    return math.ceil(epochs * steps_per_epoch(examples, accum))


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then a cosine down to a tenth of it at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
