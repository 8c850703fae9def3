"""4-bit storage of a mask gate's adapters (`save_gate(..., bits=4)`; `read_gate` reads either form).

Why: a rank-16 gate on all 30 layers of SmolLM2-135M is 4.9M values, 9.8 MB in bf16, and each
shipped version stays in git's history for good. 4 bits a value with a minimum and a step per 64
values (4.5 bits in all) is a 2.9 MB file. What it costs the masks is measured in docs/smollm2.md ("Stored
in 4 bits"); every figure on a card is measured on the form that ships.

One tensor, flattened and cut into groups of GROUP consecutive values (row-major):

    values   x0 x1 ... x63 | x64 ... x127 | ...
    group g  lo[g] = min, step[g] = (max - lo) / 15          (float16, stored)
    code     q = round((x - lo) / step) in 0..15             x ~ lo + step * q
    bytes    code of x(2i) in the low nibble of byte i, x(2i+1) in the high nibble

A tensor stores as `NAME.q4` (uint8, shape (..., last / 2): it keeps the tensor's shape),
`NAME.lo` and `NAME.step` (float16, one per group). A tensor whose size is not a whole number of
groups, or whose last dimension is odd, cannot take this form (`packable`): it is stored as it is.
"""
from __future__ import annotations

import torch

GROUP = 64
STORAGE = "q4g64"  # the metadata value (`gate_storage`) that names this form
SUFFIXES = (".q4", ".lo", ".step")


def packable(x: torch.Tensor) -> bool:
    return x.dim() >= 1 and x.numel() % GROUP == 0 and x.shape[-1] % 2 == 0


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, lo, step) of one tensor; codes are taken against the stored (float16) lo and step, so
    the rounding of those is part of what the codes correct for."""
    if not packable(x):
        raise ValueError(f"a tensor of shape {tuple(x.shape)} cannot be stored in 4 bits: its size must be "
                         f"a multiple of {GROUP} and its last dimension even")
    g = x.detach().float().reshape(-1, GROUP)  # (groups, GROUP)
    lo = g.amin(1).half()
    step = ((g.amax(1) - lo.float()) / 15).half()
    if not (torch.isfinite(lo).all() and torch.isfinite(step).all()):  # NaN, inf, or past float16's 65,504
        raise ValueError(f"a tensor of shape {tuple(x.shape)} cannot be stored in 4 bits: it holds NaN or "
                         f"infinite values, or a range past float16's {torch.finfo(torch.float16).max:,.0f}; "
                         "store it in 16 bits (training.gate_export --bits 16)")
    safe = torch.where(step > 0, step.float(), torch.ones_like(step, dtype=torch.float32))
    q = torch.round((g - lo.float()[:, None]) / safe[:, None]).clamp(0, 15).to(torch.uint8)
    q = q.reshape(-1, 2)  # (values / 2, 2): neighbours share a byte
    packed = q[:, 0] | (q[:, 1] << 4)
    return packed.reshape(*x.shape[:-1], x.shape[-1] // 2), lo, step


def dequantize(codes: torch.Tensor, lo: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The float32 tensor that (codes, lo, step) stand for, shaped (..., 2 * codes.shape[-1])."""
    if codes.dtype != torch.uint8 or lo.shape != step.shape or codes.numel() * 2 != lo.numel() * GROUP:
        raise ValueError(f"malformed 4-bit tensor: codes {codes.dtype} {tuple(codes.shape)}, "
                         f"lo {tuple(lo.shape)}, step {tuple(step.shape)} (groups of {GROUP})")
    flat = codes.reshape(-1)
    q = torch.stack((flat & 15, flat >> 4), 1).reshape(-1, GROUP).float()  # (groups, GROUP)
    x = lo.float()[:, None] + step.float()[:, None] * q
    return x.reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def pack_state(state: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Every tensor of `state` in 4 bits (NAME.q4, NAME.lo, NAME.step), except one that cannot take
    that form (`packable`: a tiny model's adapter), which is stored as it is, in `dtype`."""
    out = {}
    for name, x in state.items():
        if not packable(x):
            out[name] = x.to(dtype).contiguous()
            continue
        out.update({name + suffix: part.contiguous() for suffix, part in zip(SUFFIXES, quantize(x))})
    return out


def unpack_state(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`pack_state`'s inverse: the 4-bit tensors in float32, any other tensor as stored."""
    names = {k[: -len(".q4")] for k in stored if k.endswith(".q4")}
    parts = {n + s for n in names for s in SUFFIXES}
    out = {k: v for k, v in stored.items() if k not in parts}
    for n in names:
        if n + ".lo" not in stored or n + ".step" not in stored:
            raise ValueError(f"4-bit tensor {n} lacks its .lo or .step")
        out[n] = dequantize(stored[n + ".q4"], stored[n + ".lo"], stored[n + ".step"])
    return out
