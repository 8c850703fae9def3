"""What `torch.compile` costs before it pays: cold and warm starts, graphs, memory.

    python -m benchmarks.compile_cost --output runs/compile-cost
    python -m benchmarks.compile_cost --methods ar-compiled,mars-compiled --batch-size 4 --n 16

Every method runs in fresh Python processes, one after the other (never two at once), three
starts each:

* cold:       a new process and an empty compiler cache (TORCHINDUCTOR_CACHE_DIR): what the
              first start of a server or a Space costs;
* disk-warm:  a new process whose compiler cache the cold start filled: a restart;
* in-process: the same prompts decoded again in the cold start's process: every later request.

For each start: seconds to the first token of the first prompt (TTFT), seconds to the end of the
first chunk of `--batch-size` prompts, seconds for all `--n` prompts, and the graphs
torch.compile built (which includes every recompile: a new batch bucket, a new buffer
capacity). Memory: the process's peak resident set (ru_maxrss) and its growth over the loaded
model. The eager methods are in the table as the cost of not compiling.
Outputs: compile_cost.md and compile_cost.json in --output.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

METHODS = ("ar-cursor", "ar-compiled", "ar-static-compile", "mars-cursor", "mars-compiled", "mars-lossless",
           "mars-lossless-compiled")
DEFAULT_AR = "assets/models/tiny-ar-sft"
DEFAULT_MARS = "assets/models/tiny-mars-b4"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class _FirstToken:
    """A `generate` streamer that notes when the first generated token arrives (the first
    `put` is the prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, _):
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self):
        pass


def _decoder(method: str, args):
    """(model, decode(chunk of prompt ids) -> seconds to its first token) for `method`."""
    import torch

    from mars_core.config import DecodeConfig
    from mars_core.decoding import left_pad
    from mars_core.generate import decode_steps
    from mars_core.loading import load_model
    from mars_core.prompts import special_ids

    mars = method.startswith("mars")
    model, tok = load_model(args.mars_model if mars else args.ar_model, device=args.device)
    if method == "ar-static-compile":
        from transformers import CompileConfig

        cc = CompileConfig(fullgraph=False, dynamic=None, mode="default")
        cc._compile_all_devices = True  # as in the benchmark: HF compiles on accelerators only by default
        _, pad_id, stop = special_ids(model, tok)

        def decode(ids):
            x, valid = left_pad(ids, pad_id, args.device)
            t0, streamer = time.perf_counter(), _FirstToken()
            with torch.no_grad():
                model.generate(x, attention_mask=valid.long(), do_sample=False, max_new_tokens=args.max_new_tokens,
                               pad_token_id=pad_id, eos_token_id=stop, cache_implementation="static",
                               compile_config=cc, streamer=streamer if len(ids) == 1 else None)
            return (streamer.first or time.perf_counter()) - t0
        return model, tok, decode
    mode = "lossless" if "lossless" in method else "mars" if mars else "ar"
    cfg = DecodeConfig(mode=mode, tau=args.tau if mode == "mars" else 1.0, block_size=args.block_size,
                       cache="cursor", compile=method.endswith("compiled"), max_new_tokens=args.max_new_tokens)

    def decode(ids):
        t0, first = time.perf_counter(), None
        _, steps = decode_steps(model, tok, ids, cfg)
        for _ in steps:
            first = first or time.perf_counter()
        return first - t0
    return model, tok, decode


def child(method: str, args) -> dict:
    """One start of `method` in this process: the measurement dict (printed as JSON)."""
    import torch

    from mars_core.prompts import encode_prompt
    from tasks.synthetic import make_examples

    torch.set_num_threads(args.threads)
    model, tok, decode = _decoder(method, args)
    ids = [encode_prompt(tok, ex["messages"][0]["content"]) for ex in make_examples(args.n, args.seed, "eval")]
    chunks = [ids[i:i + args.batch_size] for i in range(0, len(ids), args.batch_size)]
    loaded = _rss_mb()

    def run():
        g0, t0 = _graphs(), time.perf_counter()
        ttft = decode(chunks[0])
        first_chunk = time.perf_counter() - t0
        for c in chunks[1:]:
            decode(c)
        return {"ttft_s": ttft, "first_chunk_s": first_chunk, "all_s": time.perf_counter() - t0,
                "graphs": _graphs() - g0}

    first = run()
    again = run()
    out = {"start": first, "in_process": again, "rss_loaded_mb": loaded, "rss_peak_mb": _rss_mb()}
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        out["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20  # CUDA graphs keep their own pool
    return out


def _spawn(method: str, args, cache_dir: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.compile_cost", "--child", method] + _forward_args(args)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.time_limit)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{method}: the measuring process failed ({tail[:300]})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _forward_args(args) -> list[str]:
    return ["--ar-model", args.ar_model, "--mars-model", args.mars_model, "--n", str(args.n),
            "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
            "--tau", str(args.tau), "--block-size", str(args.block_size), "--threads", str(args.threads),
            "--seed", str(args.seed), "--device", args.device]


def measure(args) -> dict:
    rows = []
    for method in args.methods:
        print(f"[compile_cost] {method}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            cold = _spawn(method, args, cache)
            warm = _spawn(method, args, cache)
        rows.append({"method": method, "cold": cold["start"], "disk_warm": warm["start"],
                     "in_process": cold["in_process"], "rss_loaded_mb": cold["rss_loaded_mb"],
                     "rss_peak_mb": cold["rss_peak_mb"], "gpu_peak_mb": cold.get("gpu_peak_mb")})
    return {"settings": {k: v for k, v in vars(args).items() if k not in ("child", "output")}, "rows": rows}


def table(result: dict) -> str:
    s = result["settings"]
    lines = [f"{s['n']} held-out prompts at batch {s['batch_size']}, max_new_tokens={s['max_new_tokens']}, "
             f"tau {s['tau']:g} (MARS), {s['threads']} torch threads; every start a fresh process.", "",
             "| method | start | TTFT s | first chunk s | all prompts s | graphs built | peak RSS MB | RSS growth MB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        for key, label in (("cold", "cold (empty compiler cache)"), ("disk_warm", "new process, cache on disk"),
                           ("in_process", "again in the same process")):
            m = r[key]
            mem = (f"{r['rss_peak_mb']:.0f} | {r['rss_peak_mb'] - r['rss_loaded_mb']:.0f}" if key == "cold" else " | ")
            if key == "cold" and r.get("gpu_peak_mb") is not None:
                mem += f" (GPU peak {r['gpu_peak_mb']:.0f})"
            lines.append(f"| {r['method']} | {label} | {m['ttft_s']:.2f} | {m['first_chunk_s']:.2f} | {m['all_s']:.2f} "
                         f"| {m['graphs']} | {mem} |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    from mars_core.lists import list_arg

    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", type=list_arg(str), default=METHODS, help=f"comma-separated, of {', '.join(METHODS)}")
    p.add_argument("--ar-model", default=DEFAULT_AR)
    p.add_argument("--mars-model", default=DEFAULT_MARS)
    p.add_argument("--n", type=int, default=8, help="held-out prompts per start (default 8)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--tau", type=float, default=0.95)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA, compile=True runs CUDA graphs)")
    p.add_argument("--time-limit", type=float, default=1800, help="seconds one start may take (default 1800)")
    p.add_argument("--output", default="compile-cost")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    from mars_core.config import check_tau

    p = parser()
    a = p.parse_args(argv)
    for name in ("n", "batch_size", "max_new_tokens", "block_size", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    try:
        check_tau(a.tau, "probability")
        if a.child:
            print(json.dumps(child(a.child, a)))
            return 0
        unknown = [m for m in a.methods if m not in METHODS]
        if unknown or not a.methods:
            raise ValueError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; allowed: {', '.join(METHODS)}")
        result = measure(a)
    except (ValueError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.output, exist_ok=True)
    with open(os.path.join(a.output, "compile_cost.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    text = table(result)
    with open(os.path.join(a.output, "compile_cost.md"), "w", encoding="utf-8") as f:
        f.write("# Compile cost\n\n" + text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
