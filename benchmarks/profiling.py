"""Where a decode spends its time: the model's forward against the decode loop around it.

    python -m benchmarks.profiling --method mars-cursor --batch-size 16
    python -m benchmarks.profiling --method ar --batch-size 1 --top 20 --output runs/profile.txt

Decodes the same held-out synthetic prompts as `python -m benchmarks.bench` once to warm up, then
once more under `torch.profiler`, and prints

* wall-clock, forwards and milliseconds per forward;
* the share of the wall-clock spent inside `model.forward` (timed with forward hooks) and the
  rest, which is the decode loop's own overhead: acceptance, the one host sync per step, building
  ids / positions / masks, cache bookkeeping;
* the profiler's top operators by self CPU time.

This is the tool behind the numbers in the benchmark section of the README: run it before and
after a change to the decode loop.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from mars_core.config import METRICS, check_tau
from mars_core.loading import DTYPES, load_model
from mars_core.prompts import encode_prompt
from tasks.synthetic import make_examples

from . import methods_exact  # noqa: F401  (registers mars-lossless and mars-lossless-compiled)
from .measure import DEFAULT_AR, DEFAULT_MARS, run_all
from .methods import fixed_methods, method_list


class ForwardTimer:
    """Total wall-clock spent inside `model.forward`, with a pre- and a post-hook."""

    def __init__(self, model):
        self.seconds, self.calls, self._t = 0.0, 0, 0.0
        self.handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, *_):
        self._t = time.perf_counter()

    def _post(self, *_):
        self.seconds += time.perf_counter() - self._t
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


class StepTimer:
    """For the compiled path (`compile=True`): wall-clock inside its compiled functions (the first
    step's forward; every later step's forward, acceptance and cut in one graph). A forward hook
    cannot time them: a hook inside the graph would be traced into it."""

    def __init__(self):
        from mars_core import decode_compiled

        self.module, self.seconds, self.calls = decode_compiled, 0.0, 0
        self.original = decode_compiled.compiled
        decode_compiled.compiled = self._wrap

    def _wrap(self, fn, mode):
        run = self.original(fn, mode)

        def timed(*a, **kw):
            t = time.perf_counter()
            out = run(*a, **kw)
            # the outputs are ready only once read (the step ends with this host sync anyway)
            (out[-1] if isinstance(out, tuple) else out[:, :1, :1]).tolist()
            self.seconds += time.perf_counter() - t
            self.calls += 1
            return out
        return timed

    def remove(self):
        self.module.compiled = self.original


def profile(args) -> str:
    (method,) = method_list([args.method], (args.cache_block_size,))
    model, tok = load_model(args.ar_model if method.model == "ar" else args.mars_model, dtype=getattr(torch, args.dtype))
    prompts = [ex["messages"][0]["content"] for ex in make_examples(args.batch_size, args.seed, "eval")]
    ids = [encode_prompt(tok, p) for p in prompts]
    run_all(method, model, tok, ids, args.batch_size, args.tau, args)  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_all(method, model, tok, ids, args.batch_size, args.tau, args)
    # The profiler slows every op down; the time split comes from a second, unprofiled run.
    timer = StepTimer() if method.compile else ForwardTimer(model)
    res = run_all(method, model, tok, ids, args.batch_size, args.tau, args)
    timer.remove()
    inside = "inside the compiled step (forward + acceptance)" if method.compile else "inside model.forward"
    tokens = sum(len(t) for t in res["ids"])
    wall, calls = res["seconds"], max(res["calls"], 1)  # every forward (the compiled path's first step too)
    lines = [
        f"{args.method} batch {args.batch_size} tau {args.tau} {args.dtype}: {wall * 1e3:.1f} ms, {tokens} tokens, "
        f"{calls} forwards, {wall / calls * 1e3:.2f} ms per forward",
        f"{inside}: {timer.seconds * 1e3:.1f} ms ({timer.seconds / wall:.0%}); "
        f"decode loop around it: {(wall - timer.seconds) * 1e3:.1f} ms ({1 - timer.seconds / wall:.0%}), "
        f"{(wall - timer.seconds) / calls * 1e3:.2f} ms per step",
        "",
        prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="mars-cursor",
                   help="one of " + ", ".join(fixed_methods()) + ", mars-block-<N> (default mars-cursor)")
    p.add_argument("--ar-model", default=DEFAULT_AR)
    p.add_argument("--mars-model", default=DEFAULT_MARS)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--tau", type=float, default=0.95)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--cache-block-size", type=int, default=16)
    p.add_argument("--metric", default="probability", choices=METRICS)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompt-lookup-tokens", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--top", type=int, default=15, help="operators to list (default 15)")
    p.add_argument("--output", help="also write the report to this file")
    a = p.parse_args(argv)
    for name in ("batch_size", "block_size", "cache_block_size", "max_new_tokens", "threads", "top"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    try:
        method_list([a.method], (a.cache_block_size,))
        check_tau(a.tau, a.metric)
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(a.threads)
    try:
        report = profile(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report)
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
