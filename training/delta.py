"""A training snapshot's layers as the delta the repository carries (assets/models/<name>/).

The delta (trained - base) is small next to the weights. Its matrices are stored as int8 with one
fp32 scale per row (`KEY` and `KEY.row_scale`: the row's largest |value| / 127, so the error is at
most half a step, about 0.75% of the delta's norm measured on the real fine-tune), its vectors (the
norms) in bf16: half the size of an all-bf16 delta (20 against 40.5 MiB), which is what the
repository's history pays each time the model is retrained. The shipped model is base + the
dequantised delta, and every figure on its card is measured on that model as `load_model(name)`
gives it, not on the fp32 snapshot. `--format bf16` writes the older all-bf16 form (both load).

    python -m training.delta runs/smollm2-mars/latest.pt assets/models/smollm2-135m-mars

A run trained with `--lora-rank` on top of the shipped delta (`frozen_stage --init
FOLDER/delta.safetensors`) ships its adapters instead: `--lora` writes `lora.safetensors`, `KEY.lora_a`
and `KEY.lora_b` (scale folded in) in bf16, which `load_model` adds after `delta.safetensors`. It
refuses a folder whose delta is not the one the adapters were trained on (checked by sha256): there
they would ship on weights they never saw.

    python -m training.delta runs/smollm2-mars-lora/latest.pt assets/models/smollm2-135m-mars --lora
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mars_core.packaged import DELTA_FILES, ROW_SCALE, ensure_named, sha256_of


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


def check_lora_base(path: str, snapshot: dict, out: str) -> None:
    """Adapters ship on top of OUT's delta.safetensors: it must be the delta they were trained on."""
    if "lora" not in snapshot:
        raise ValueError(f"{path} has no adapters (it was not trained with --lora-rank)")
    trained_on = snapshot["state"].get("init_sha256")  # None: the bare base; absent: a run from fp32 layers
    if "init_sha256" not in snapshot["state"]:
        raise ValueError(f"{path} trained its adapters on the fp32 layers of {snapshot['state']['args'].get('init')}, "
                         "not on a shipped delta: they would ship on weights they never saw (train the continuation "
                         "with frozen_stage --init FOLDER/delta.safetensors)")
    there = os.path.join(out, DELTA_FILES[0])
    shipped = sha256_of(there) if os.path.isfile(there) else None
    if shipped != trained_on:
        raise ValueError(f"{path} trained its adapters on {snapshot['state']['args'].get('init') or 'the bare base'}, "
                         f"but {out} ships {'another delta' if shipped else 'no delta'} under them: write them beside "
                         "the delta they were trained on")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("snapshot")
    p.add_argument("out")
    p.add_argument("--base", default="smollm2-135m-instruct", help="a model name, or a folder with model.safetensors")
    p.add_argument("--format", default="int8", choices=("int8", "bf16"))
    p.add_argument("--lora", action="store_true", help="write the snapshot's adapters as lora.safetensors")
    args = p.parse_args(argv)
    snapshot = torch.load(args.snapshot)
    try:
        if args.lora:
            check_lora_base(args.snapshot, snapshot, args.out)
            delta = {k: v.to(torch.bfloat16).contiguous() for k, v in snapshot["lora"].items()}
            name, fmt = DELTA_FILES[1], "lora-bf16"
        else:
            if os.path.isfile(os.path.join(args.out, DELTA_FILES[1])):
                raise ValueError(f"{args.out} holds {DELTA_FILES[1]}, adapters trained on the delta this would replace: "
                                 "remove it first (a new delta ships alone, or with adapters trained on it)")
            base = load_file(Path(args.base) / "model.safetensors" if os.path.isdir(args.base)
                             else ensure_named(args.base) / "model.safetensors")
            delta, name, fmt = make_delta(snapshot["layers"], base, args.format), DELTA_FILES[0], args.format
    except ValueError as e:
        print(f"error: {e}")
        return 2
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, name + ".tmp")
    # the minutes let a run that starts from this delta (frozen_stage --init) continue the clock
    minutes = str(snapshot.get("state", {}).get("minutes", 0.0))
    meta = {"base": args.base, "format": fmt, "minutes": minutes}
    if args.lora:  # which delta the adapters were trained on, for whoever loads the pair
        meta["delta_sha256"] = snapshot["state"]["init_sha256"] or ""
    save_file(delta, tmp, metadata=meta)
    os.replace(tmp, os.path.join(args.out, name))
    size = os.path.getsize(os.path.join(args.out, name)) / 2**20
    print(f"{len(delta)} tensors, {size:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
