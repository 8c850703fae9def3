"""Decoding speed benchmark: AR baselines against MARS with every KV-cache mode, in one run.

    python -m benchmarks.bench --output runs/bench
    python -m benchmarks.bench --ar-model A --mars-model M --batch-sizes 1,8 --taus 0.95,0.8 --output out/

Every method decodes the same prompts (default: held-out synthetic problems) with the same
`max_new_tokens`, greedy. Methods are timed in one process, after a warm-up, interleaved chunk by
chunk: in each repetition every batch of prompts is decoded by every method in turn, in an order
that rotates, so that a drift of the machine (another job, throttling, a shared VM's neighbours)
hits all of them alike. The reported wall-clock is the median over the repetitions. Counts
exclude prompt tokens and EOS.

The methods are registered in methods.py; `--help` lists them. Speed-up is tokens/s over the
AR-with-KV-cache baseline: the fastest of the rows marked `baseline` there, at the same batch
size. Methods can stop at EOS at different points, so speed is compared as tokens/s (not as
wall-clock). `= ref` is the fraction of prompts whose output equals, token for token, the
reference of its model (marked `reference`): hf-generate for the AR model, mars-nocache (same
tau) for the MARS model. Outputs: bench.md (the table), bench.json, bench.html (plotly).

The pieces: methods.py (the registry of methods and their runners), measure.py (warm-up,
interleaved repetitions, scoring), report.py (table, figure, files); this file is the CLI.
"""
from __future__ import annotations

import argparse
import sys

import torch

from mars_core.config import METRICS, DecodeConfig, check_tau
from mars_core.lists import list_arg
from mars_core.loading import DTYPES, trained_block_size

from . import methods_exact  # noqa: F401  (registers mars-lossless, mars-lossless-compiled, the lookup rows, spec, spec-mars, hf-assisted)
from .measure import DEFAULT_AR, DEFAULT_DRAFT, DEFAULT_MARS, benchmark
from .methods import ar_baselines, default_methods, method_list, methods_doc, methods_help
from .report import table, write_outputs


def parser() -> argparse.ArgumentParser:
    doc = (__doc__ + "\nMethods (AR ones on the AR model, MARS ones on the MARS model):\n\n" + methods_doc()
           + "\n\nBaselines (AR with KV cache): " + ", ".join(ar_baselines()) + "\n")
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ar-model", default=DEFAULT_AR, help=f"AR baseline folder or hub id (default {DEFAULT_AR})")
    p.add_argument("--mars-model", default=DEFAULT_MARS, help=f"MARS model folder or hub id (default {DEFAULT_MARS})")
    p.add_argument("--prompts", help="JSONL of {\"prompt\": ..., \"answer\": optional} or chat records "
                                     "({\"messages\": [...], \"answer\": ...}); default: held-out synthetic problems")
    p.add_argument("--n", type=int, default=32, help="number of prompts (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic eval problems (default 0)")
    p.add_argument("--batch-sizes", type=list_arg(int, minimum=1), default=(1, 4, 8, 16), help="comma-separated (default 1,4,8,16)")
    p.add_argument("--taus", type=list_arg(float), default=(0.95,), help="comma-separated MARS thresholds (default 0.95)")
    p.add_argument("--metric", default="probability", choices=METRICS)
    p.add_argument("--block-size", type=int, default=None,
                   help="MARS block size B (default: the MARS model's training block size, else 4)")
    p.add_argument("--cache-block-sizes", type=list_arg(int, minimum=1), default=(4, 8, 16, 32, 64),
                   help="block-level cache sizes for mars-block (default 4,8,16,32,64)")
    p.add_argument("--methods", type=list_arg(str), default=default_methods(), help=methods_help())
    p.add_argument("--max-new-tokens", type=int, default=128, help="generated tokens per prompt, at most (default 128)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per method, interleaved (default 3)")
    p.add_argument("--draft-model", default=DEFAULT_DRAFT,
                   help=f"draft model of spec, spec-mars and hf-assisted (default {DEFAULT_DRAFT}, the bundled "
                        f"small draft; {DEFAULT_AR} is the same-size one)")
    p.add_argument("--draft-tokens", type=int, default=4, help="K, tokens the draft proposes per step (default 4)")
    p.add_argument("--draft-block-size", type=int, default=1,
                   help="1: the draft decodes AR; > 1: a MARS draft decodes with MARS, blocks of this size (default 1)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens of hf-prompt-lookup, prompt_lookup_tokens of "
                   "mars-lossless-lookup (default 10)")
    p.add_argument("--draft-tree", type=list_arg(int, minimum=1), default=(2, 1, 1),
                   help="widths per distance of mars-lossless-tree's draft tree (default 2,1,1)")
    p.add_argument("--draft-budget", type=list_arg(int, minimum=1), default=(8, 2),
                   help="nodes,groups of mars-lossless-budget's planned drafts (default 8,2)")
    p.add_argument("--threads", type=int, default=2, help="torch threads, fixed for the whole run (default 2)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights and compute dtype of both models (default float32, as the bundled models are saved)")
    p.add_argument("--prepack", action="store_true",
                   help="both models' linear layers on oneDNN's prepacked matmul (CPU; mars_core.cpu.prepack), every method alike")
    p.add_argument("--output", default="bench", help="folder for bench.md, bench.json, bench.html (default ./bench)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    for name, minimum in (("n", 1), ("max_new_tokens", 1), ("repeats", 1), ("prompt_lookup_tokens", 1), ("threads", 1),
                          ("draft_tokens", 1), ("draft_block_size", 1)):
        if getattr(a, name) < minimum:
            p.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(a, name)}")
    if a.block_size is None:
        a.block_size = trained_block_size(a.mars_model) or 4
    if a.block_size < 1:
        p.error(f"--block-size must be >= 1, got {a.block_size}")
    if any(m.startswith("mars-lossless-tree") for m in a.methods):
        try:
            DecodeConfig(mode="lossless", block_size=a.block_size, draft_tree=tuple(a.draft_tree))
        except ValueError as e:
            p.error(f"--draft-tree: {e}")
    if any(m.startswith("mars-lossless-budget") for m in a.methods):
        try:
            DecodeConfig(mode="lossless", block_size=a.block_size, draft_budget=tuple(a.draft_budget))
        except ValueError as e:
            p.error(f"--draft-budget: {e}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    try:
        method_list(a.methods, a.cache_block_sizes)
        for t in a.taus:
            check_tau(t, a.metric)
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(a.threads)
    try:
        result = benchmark(a)
        paths = write_outputs(result, a.output)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(result))
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
