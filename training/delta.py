"""A training snapshot's layers as the delta the repository carries (assets/models/<name>/).

The delta (trained - base) is small next to the weights. Its matrices are stored as int8 with one
fp32 scale per row (`KEY` and `KEY.row_scale`: the row's largest |value| / 127, so the error is at
most half a step, about 0.75% of the delta's norm measured on the real fine-tune), its vectors (the
norms) in bf16: half the size of an all-bf16 delta (20 against 40.5 MiB), which is what the
repository's history pays each time the model is retrained. The shipped model is base + the
dequantised delta, and every figure on its card is measured on that model as `load_model(name)`
gives it, not on the fp32 snapshot. `--format bf16` writes the older all-bf16 form (both load).

    python -m training.delta runs/smollm2-mars/latest.pt assets/models/smollm2-135m-mars

A run trained with `--lora-rank` on top of the shipped delta (`frozen_stage --init` of the run that
delta came from) ships its adapters instead: `--lora` writes `lora.safetensors`, `KEY.lora_a` and
`KEY.lora_b` (scale folded in) in bf16, which `load_model` adds after `delta.safetensors`.

    python -m training.delta runs/smollm2-mars-lora/latest.pt assets/models/smollm2-135m-mars --lora
"""
from __future__ import annotations

import argparse
import os

import torch
from safetensors.torch import load_file, save_file

from mars_core.packaged import ROW_SCALE, ensure_named


def make_delta(layers: dict[str, torch.Tensor], base: dict[str, torch.Tensor], fmt: str = "int8") -> dict[str, torch.Tensor]:
    """The tensors of delta.safetensors for every trained tensor that moved: fmt "int8" gives a
    matrix as int8 plus `KEY.row_scale` (fp32, one per row) and a vector as bf16; fmt "bf16" gives
    every tensor as bf16(trained - base)."""
    if fmt not in ("int8", "bf16"):
        raise ValueError(f"fmt must be 'int8' or 'bf16', got {fmt!r}")
    out = {}
    for key, trained in layers.items():
        if key not in base:
            raise ValueError(f"the snapshot has {key!r}, which the base does not")
        d = trained.float() - base[key].float()
        if not torch.any(d != 0):
            continue
        if fmt == "int8" and d.dim() == 2:
            scale = d.abs().amax(dim=1) / 127  # (rows,)
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))
            out[key] = torch.round(d / safe[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            out[key + ROW_SCALE] = scale.contiguous()
        else:
            out[key] = d.to(torch.bfloat16).contiguous()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("snapshot")
    p.add_argument("out")
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--format", default="int8", choices=("int8", "bf16"))
    p.add_argument("--lora", action="store_true", help="write the snapshot's adapters as lora.safetensors")
    args = p.parse_args(argv)
    snapshot = torch.load(args.snapshot)
    if args.lora:
        if "lora" not in snapshot:
            print(f"error: {args.snapshot} has no adapters (it was not trained with --lora-rank)")
            return 2
        delta, name, fmt = {k: v.to(torch.bfloat16).contiguous() for k, v in snapshot["lora"].items()}, "lora.safetensors", "lora-bf16"
    else:
        base = load_file(ensure_named(args.base) / "model.safetensors")
        delta, name, fmt = make_delta(snapshot["layers"], base, args.format), "delta.safetensors", args.format
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, name + ".tmp")
    save_file(delta, tmp, metadata={"base": args.base, "format": fmt})
    os.replace(tmp, os.path.join(args.out, name))
    size = os.path.getsize(os.path.join(args.out, name)) / 2**20
    print(f"{len(delta)} tensors, {size:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
