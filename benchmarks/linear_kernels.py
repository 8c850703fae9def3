"""One linear layer on the three CPU kernels a float32 forward can take, in microseconds per call.

`F.linear` (MKL, packing the weight on every call), MKL's prepacked matmul (what inductor's freezing
uses on x86 float32) and oneDNN's prepacked matmul (`mars_core.cpu.prepack`), for a few rows per
call: a MARS forward is a few rows, AR one. The table behind docs/cpu-kernels.md:

    python -m benchmarks.linear_kernels --rows 1,2,8,14
"""
from __future__ import annotations

import argparse
import time

import torch

SHAPES = ((1536, 576), (576, 1536), (49152, 576))  # SmolLM2-135M: MLP up, MLP down, the head (out x in)


def per_call(fn, calls: int) -> float:
    for _ in range(max(calls // 10, 3)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(out_f: int, in_f: int, rows: int, calls: int) -> dict[str, float]:
    w, x = torch.randn(out_f, in_f), torch.randn(rows, in_f)
    mkl = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    dnn = torch.ops.mkldnn._reorder_linear_weight(w)
    with torch.inference_mode():
        return {"F.linear": per_call(lambda: torch.nn.functional.linear(x, w), calls),
                "MKL packed": per_call(lambda: torch.ops.mkl._mkl_linear(x, mkl, w, None, rows), calls),
                "oneDNN packed": per_call(lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, None, "none", [], ""),
                                          calls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,2,8,14")
    p.add_argument("--calls", type=int, default=300, help="timed calls per cell (a tenth of them for the head), >= 1")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
        if min(rows) < 1 or args.calls < 1:
            raise ValueError
    except ValueError:
        p.error(f"--rows takes positive integers separated by commas (got {args.rows!r}), --calls one >= 1")
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available()):
        print("error: this PyTorch build lacks MKL or oneDNN: nothing to compare")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} threads, microseconds per call")
    print("| layer (out x in) | rows | F.linear (MKL) | MKL packed (freezing) | oneDNN packed (prepack) |")
    print("|---|---:|---:|---:|---:|")
    for out_f, in_f in SHAPES:
        cells = [measure(out_f, in_f, r, args.calls if out_f < 10_000 else max(args.calls // 10, 1)) for r in rows]
        cols = [" / ".join(f"{c[k]:.0f}" for c in cells) for k in ("F.linear", "MKL packed", "oneDNN packed")]
        print(f"| {out_f} x {in_f} | {' / '.join(map(str, rows))} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
