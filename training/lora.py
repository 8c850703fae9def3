"""Low-rank adapters (LoRA) on the trained layers of `training.frozen_stage`: W x + (B A) x.

A run continued as LoRA changes each matrix of the top layers by B @ A (rank r), so what the
repository must carry for it is r * (in + out) numbers a matrix, not in * out: a rank-32
continuation of the top 6 layers is about 4 MB in bf16 where a full int8 delta is 20 MB. Written
here (thirty lines) rather than with `peft`, because the shipped form is two plain matrices per
weight that `mars_core.packaged` adds to the base with no adapter library, and the snapshot keeps
the merged weights so every tool that reads a snapshot's `layers` works unchanged.
"""
from __future__ import annotations

import math

import torch
from torch import nn

MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """A frozen linear layer plus scale * B @ A; B starts at zero, so the wrapped layer starts as it was."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base, self.scale = base, alpha / rank
        base.weight.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))  # (r, in)
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # peft's default for A

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.T) @ self.lora_b.T * self.scale

    def delta(self) -> torch.Tensor:
        return (self.lora_b @ self.lora_a).detach() * self.scale  # (out, in)


def add_lora(model, split: int, rank: int, alpha: float) -> list[nn.Parameter]:
    """Wrap every matrix of decoder layers `split:` (attention and MLP); freeze all else; return
    the adapters' parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = []
    for layer in model.model.layers[split:]:
        for block in (layer.self_attn, layer.mlp):
            for name in MATRICES:
                if hasattr(block, name):
                    wrapped = LoRALinear(getattr(block, name), rank, alpha)
                    setattr(block, name, wrapped)
                    params += [wrapped.lora_a, wrapped.lora_b]
    return params


def _wrapped(model):
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name + ".weight", module


def merged_layers(model, split: int) -> dict[str, torch.Tensor]:
    """Decoder layers `split:` as plain weights (W + scale * B @ A), keyed as the unwrapped model's."""
    out = {}
    for i, layer in enumerate(model.model.layers[split:], start=split):
        for key, t in layer.state_dict().items():
            if ".lora_" in key:
                continue
            out[f"model.layers.{i}.{key.replace('.base.', '.')}"] = t.clone()
    for key, module in _wrapped(model):
        out[key] = out[key] + module.delta()
    return out


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapters alone, `KEY.lora_a` (r, in) and `KEY.lora_b` (out, r) with the scale folded into
    B, KEY being the weight's name in the unwrapped model: the form `mars_core.packaged` reads."""
    out = {}
    for key, module in _wrapped(model):
        out[key + ".lora_a"] = module.lora_a.detach().clone()
        out[key + ".lora_b"] = (module.lora_b.detach() * module.scale).clone()
    return out


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Put `adapter_state`'s tensors back into a model wrapped by `add_lora` with the same rank."""
    wrapped = dict(_wrapped(model))
    if {k.rsplit(".", 1)[0] for k in state} != set(wrapped):
        raise ValueError("the saved adapters do not match this run's wrapped layers (give the same --train-layers)")
    for key, module in wrapped.items():
        a, b = state[key + ".lora_a"], state[key + ".lora_b"]
        if a.shape != module.lora_a.shape:
            raise ValueError(f"saved adapter {key} has rank {a.shape[0]}, this run {module.lora_a.shape[0]}")
        with torch.no_grad():
            module.lora_a.copy_(a)
            module.lora_b.copy_(b / module.scale)
