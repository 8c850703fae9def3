"""Does this CPU compute bfloat16 natively? The choice of dtype for a model served on a CPU.

A 135M model at batch 1 is bound by reading its weights. In bf16 on a CPU with native bf16 dot
products (x86 `avx512_bf16` or `amx_bf16`, Arm `bf16`), a 4-token forward costs about what a
1-token one does, so MARS's extra tokens per forward are nearly free. Without them PyTorch
computes bf16 matmuls by converting to float32 (no arithmetic is saved, conversions are added), so
asking for bf16 there falls back to float32, with a note that says so. (The speed of emulated bf16
against float32 has not been measured on this repository's AVX2-only CPU; pass `torch.bfloat16`
itself to force it, as the benchmarks do.)
"""
from __future__ import annotations

import functools
import platform

import torch

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 (AVX-512, AMX) and Arm (FEAT_BF16)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The feature flags of the first processor in /proc/cpuinfo ("flags" on x86, "Features" on
    Arm); empty where the file does not exist (macOS, Windows)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


@functools.lru_cache(maxsize=1)
def native_bf16() -> bool:
    """True when this CPU has bf16 dot-product instructions (Apple silicon from M2 on counts)."""
    if set(NATIVE_BF16_FLAGS) & cpu_flags():
        return True
    return platform.system() == "Darwin" and platform.machine() == "arm64" and _apple_bf16()


def _apple_bf16() -> bool:
    import subprocess

    try:
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.stdout.strip() == "1"


def cpu_dtype(requested: str, native: bool | None = None) -> tuple[torch.dtype, str | None]:
    """(dtype, note) for a model on the CPU. "bfloat16" is honoured only with native bf16 and
    "auto" picks it there; otherwise float32, and the note says why (None when nothing changed)."""
    native = native_bf16() if native is None else native
    if requested == "auto":
        return (torch.bfloat16, None) if native else (torch.float32, None)
    if requested == "bfloat16" and not native:
        return torch.float32, ("bfloat16 asked for, but this CPU has no native bf16 (avx512_bf16, amx_bf16 or "
                               "Arm bf16), where bf16 runs slower than float32: using float32")
    return getattr(torch, requested), None
