"""A training snapshot's layers as the bf16 delta the repository carries (assets/models/<name>/).

The delta (trained - base) is small next to the weights, so bf16 keeps it to about 2^-9 of its
own size; the shipped model is base + bf16(delta), and every figure on its card is measured on
that model as `load_model(name)` gives it, not on the fp32 snapshot.

    python -m training.delta runs/smollm2-mars/latest.pt assets/models/smollm2-135m-mars
"""
from __future__ import annotations

import argparse
import os

import torch
from safetensors.torch import load_file, save_file

from mars_core.packaged import ensure_named


def make_delta(layers: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{key: bf16(trained - base)} for every trained tensor that moved."""
    out = {}
    for key, trained in layers.items():
        if key not in base:
            raise ValueError(f"the snapshot has {key!r}, which the base does not")
        d = trained.float() - base[key].float()
        if torch.any(d != 0):
            out[key] = d.to(torch.bfloat16).contiguous()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("snapshot")
    p.add_argument("out")
    p.add_argument("--base", default="smollm2-135m-instruct")
    args = p.parse_args(argv)
    base = load_file(ensure_named(args.base) / "model.safetensors")
    delta = make_delta(torch.load(args.snapshot)["layers"], base)
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, "delta.safetensors.tmp")
    save_file(delta, tmp, metadata={"base": args.base, "dtype": "bfloat16"})
    os.replace(tmp, os.path.join(args.out, "delta.safetensors"))
    size = os.path.getsize(os.path.join(args.out, "delta.safetensors")) / 2**20
    print(f"{len(delta)} tensors, {size:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
