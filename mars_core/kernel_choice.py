"""`prepack="auto"`: pack a CPU model's linear layers only where that measures faster here.

oneDNN's prepacked matmul (`cpu.prepack`) made float32 forwards faster on the AMD CPU it was chosen
on, and bf16 ones on an Intel Xeon with AMX; on that Xeon it made float32 forwards slower (one token
over 256 cached: 60.2 ms packed against 44.8 plain; docs/exact-step.md). Which kernel wins depends
on the CPU and the dtype, so "auto" times both, once per model shape, dtype, CPU, torch and thread
count (the key of `timing.machine_key`), keeps the answer on disk and packs only if it won.

(The float32 figures were taken with the adapters running in every forward; on the base alone the
two kernels measured within 3% in float32 there, 144 ms plain against 140 packed for 1 + 12 tokens.)

The measure: the median eager forward of 1 and of 12 new tokens over 256 cached ones (an AR step
and a typical exact MARS step; a gated model's wide window holds masks), plain then packed, the
two summed; packed wins only when it is faster by more than `MARGIN`.
"""
from __future__ import annotations

import torch

from .cpu import PackedLinear, prepack
from .timing import cached, machine_key, timed_widths
from .prompts import context_limit

WIDTHS = (1, 12)
MARGIN = 0.03  # a difference within the spread of two medians is no reason to swap every layer


def unpack(model: torch.nn.Module) -> int:
    """Put back a plain `nn.Linear` (the same weight and bias Parameters) for every `PackedLinear`."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                         device="meta")
                linear.weight, linear.bias = child.weight, child.bias
                setattr(parent, name, linear)
                n += 1
    return n


@torch.no_grad()
def measure(model: torch.nn.Module, repeats: int = 5) -> dict:
    """{"plain": seconds, "packed": seconds or None (oneDNN cannot pack it here), "note": why not}:
    the summed median forwards of `WIDTHS`, the model left as it was (plain)."""
    limit = context_limit(model) or 1 << 30
    context = max(1, min(256, limit - max(WIDTHS)))  # a model with a short context times what it can hold
    plain = sum(timed_widths(model, 1, context, repeats, WIDTHS).values())
    grads = [p.requires_grad for p in model.parameters()]  # prepack freezes them
    n, note = prepack(model)
    try:
        if not n:
            return {"plain": plain, "packed": None, "note": note}
        packed = sum(timed_widths(model, 1, context, repeats, WIDTHS).values())
    finally:
        unpack(model)
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)
    return {"plain": plain, "packed": packed, "note": None}


def choose_prepack(model: torch.nn.Module, cache: bool = True) -> tuple[bool, str | None]:
    """Pack `model` (a plain CPU model) if its prepacked forwards measure faster on this machine.
    Returns (packed, note); the note says why it was not packed where oneDNN could not."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return False, "prepack runs on a CPU model only: left as it is"
    if any(isinstance(m, PackedLinear) for m in model.modules()):
        return True, None  # packed already: timing it "plain" would time the packed layers and unpack them
    key = machine_key(model, 1)
    times = cached("prepack", key, lambda: measure(model)) if cache else measure(model)
    if times["packed"] is None:
        return False, times["note"]
    if times["packed"] < (1 - MARGIN) * times["plain"]:
        n, note = prepack(model)
        return bool(n), note
    return False, None


def apply_prepack(model: torch.nn.Module, how: bool | str) -> str | None:
    """`load_model`'s `prepack` setting on a loaded model: True packs, "auto" packs where it measures
    faster (`choose_prepack`), False leaves it. Returns the note of a pack that did nothing, else None."""
    if how not in (True, False, "auto"):
        raise ValueError(f"prepack must be True, False or 'auto'; got {how!r}")
    if not how:
        return None
    return choose_prepack(model)[1] if how == "auto" else prepack(model)[1]
