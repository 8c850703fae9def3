"""What a CPU does fast: native bfloat16 (the dtype a model is served in) and prepacked matmuls.

A 135M model at batch 1 is bound by reading its weights. In bf16 on a CPU with native bf16 dot
products (x86 `avx512_bf16` or `amx_bf16`, Arm `bf16`), a 4-token forward costs about what a
1-token one does, so MARS's extra tokens per forward are nearly free. Without them PyTorch
computes bf16 matmuls by converting to float32 (no arithmetic is saved, conversions are added), so
asking for bf16 there falls back to float32, with a note that says so. (The speed of emulated bf16
against float32 has not been measured on this repository's AVX2-only CPU; pass `torch.bfloat16`
itself to force it, as the benchmarks do.)

`prepack` swaps a model's linear layers for oneDNN's prepacked matmul, which on this repository's
AMD CPU makes float32 forwards faster and a wide forward cheaper relative to a 1-token one (what
MARS's speed-up follows): docs/cpu-kernels.md.
"""
from __future__ import annotations

import functools
import itertools
import platform
import weakref

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


_LAYERS: "weakref.WeakValueDictionary[int, PackedLinear]" = weakref.WeakValueDictionary()
_SLOTS = itertools.count()


@torch.library.custom_op("mars::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, bias: torch.Tensor | None, out_features: int, slot: int) -> torch.Tensor:
    """A packed layer's matmul as an op `torch.compile` keeps as it is: inductor lowers
    `mkldnn._linear_pointwise` only for weights it packed itself (freezing, where on x86 float32 it
    packs for MKL instead, which is as slow as `F.linear` for 2+ rows: docs/cpu-kernels.md). The
    layer is found by its slot at run time, so a compiled graph reads its current weight too (a
    packed tensor held as a graph constant would go stale when the weight changes)."""
    return _LAYERS[slot].matmul(x, bias)


@packed_linear.register_fake
def _(x: torch.Tensor, bias: torch.Tensor | None, out_features: int, slot: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


class PackedLinear(torch.nn.Module):
    """An `nn.Linear` whose weight oneDNN reordered into its blocked layout (inference only).

    On a CPU, PyTorch's float32 `nn.Linear` calls MKL, which repacks the weight on every call of
    a few rows and is slow on AMD processors; oneDNN's prepacked matmul (`torch.ops.mkldnn`, the
    kernel inductor's freezing uses) is not. On the 2-core AMD EPYC of this repository a forward
    of the 135M SmolLM2 model over 300 cached tokens takes 59 ms instead of 69 for one new token
    and 89 ms instead of 125 for eight (docs/cpu-kernels.md). The original Parameter stays (`weight`, `bias`), so
    `state_dict`, saving and tied embeddings are untouched; the packed copy is derived from it and
    made again whenever the weight changed since (`load_state_dict`, an in-place edit, a cast or a
    move: its version counter, storage, dtype or device), so it can never serve stale weights.
    An edit through `weight.data` bypasses the version counter: call `repack()` after one.
    Under `torch.compile` it calls `packed_linear`, which inductor leaves as it is.
    """

    def __init__(self, linear: torch.nn.Linear, batch_hint: int = 8):
        super().__init__()
        self.in_features, self.out_features, self.batch_hint = linear.in_features, linear.out_features, batch_hint
        self.weight, self.bias = linear.weight, linear.bias
        self.repack()
        self._register()

    def _register(self) -> None:
        self.slot = next(_SLOTS)
        _LAYERS[self.slot] = self

    def _stamp(self) -> tuple:
        w = self.weight
        return w._version, w.data_ptr(), w.dtype, w.device, w.shape

    def repack(self) -> None:
        """Pack the current weight (None where oneDNN cannot pack its dtype: `F.linear` then)."""
        self.packed, self.pack_error = None, None  # plain attributes: no state_dict entry, no .to()
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), self.batch_hint)
        except RuntimeError as e:  # float64, or bf16 without the instructions: F.linear, correct and slower
            self.pack_error = str(e).splitlines()[0]
        self.stamp = self._stamp()

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self._stamp() != self.stamp:
            self.repack()
        if self.packed is None:
            return torch.nn.functional.linear(x, self.weight.detach(), bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            # oneDNN's op has no autograd kernel: a backward through it would be silently wrong
            raise RuntimeError("a prepacked model is for inference: its gradients would be wrong; load it "
                               "without prepack to train")
        bias = None if self.bias is None else self.bias.detach()
        if torch.compiler.is_compiling():
            return packed_linear(x, bias, self.out_features, self.slot)
        return self.matmul(x, bias)

    def __getstate__(self):  # oneDNN's opaque tensor cannot be copied: a copy packs its own weight
        return {**self.__dict__, "packed": None, "stamp": None}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._register()


def prepack(model: torch.nn.Module, batch_hint: int = 8) -> tuple[int, str | None]:
    """Swap every plain `nn.Linear` of a CPU model for a `PackedLinear`, in place.

    The model's parameters stop requiring gradients (a packed layer refuses a backward).
    Returns (layers swapped, note): the note says why nothing was swapped (not on a CPU, no
    oneDNN, a dtype this CPU cannot pack), None otherwise. `batch_hint` is the rows per call
    oneDNN's layout is tuned for; 1 to 16 measured within noise of each other here.
    """
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return 0, "prepack runs on a CPU model only: left as it is"
    if not torch.backends.mkldnn.is_available():
        return 0, "this PyTorch build has no oneDNN: prepack left the model as it is"
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is torch.nn.Linear]  # quantised and adapter layers subclass it: not ours to pack
    layers = [PackedLinear(child, batch_hint) for _, _, child in targets]
    failed = [layer.pack_error for layer in layers if layer.packed is None]
    if failed:  # all or nothing: a half-packed model would be a puzzle
        return 0, f"oneDNN cannot pack {first.dtype} weights on this CPU ({failed[0]}): left as it is"
    for (parent, name, _), layer in zip(targets, layers):
        setattr(parent, name, layer)
    model.requires_grad_(False)  # an inference model now: forwards outside torch.no_grad() stay legal
    return len(targets), None
