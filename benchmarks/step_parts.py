"""Where a compiled exact step's time goes, against a one-token AR forward on the same machine.

    TORCHINDUCTOR_FREEZING=1 python -m benchmarks.step_parts --ar-model smollm2-135m-instruct \\
        --mars-model smollm2-135m-mars --dtype bfloat16 --draft 6,2

Each row is one function under `torch.compile` (static shapes, compiled before timing), called on a
cursor cache holding `--context` tokens, timed as the median of `--repeats` calls, each ended by a
host read:

- `ar`: the AR model's forward of one token (what every AR decode step costs);
- `window`: the AR model's forward of the exact step's window (root, `nodes` drafts, `groups`
  groups of B - 1 masks), no verification: what the width costs without a gate;
- `step on the AR model`: the same step on the AR model (its masks run through the base): what
  verification and the path's move add to `window`;
- `step`: the whole exact step on the MARS model (`exact_step.window_step`: forward, verification,
  the path's key/values moved);
- `step, adapters unstacked`: the same with a mask-gated model's sibling adapters run one matmul
  each (`gate.fuse_siblings` undone), where the MARS model carries a gate.

The ratios to `ar` are what `fastest_exact`'s cost curve should say for this width (docs/exact-step.md).
"""
from __future__ import annotations

import argparse
import time

import torch

from mars_core import load_model
from mars_core.decode_compiled import _forward
from mars_core.draft_plan import budget_plan, Candidates
from mars_core.exact_step import build_window, window_forward, window_step
from mars_core.gate import wrapped_layers
from mars_core.loading import DTYPES
from mars_core.static_cache import static_state


def timed(fn, repeats: int) -> float:
    """Median milliseconds of `fn()`, each call ended by a host read of its last output."""
    fn(), fn()  # compile, then one call on the compiled graph
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        (out[-1] if isinstance(out, tuple) else out).sum().item()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1000


def window_of(nodes: int, groups: int, n_masks: int, mask_id: int, pad_id: int):
    """A budget plan of `nodes` drafts and `groups` groups, from made-up candidates."""
    ids = tuple(tuple(range(10 + 8 * d, 18 + 8 * d)) for d in range(n_masks))
    probs = tuple(tuple(0.5 ** (r + 1) for r in range(8)) for _ in range(n_masks))
    plan = budget_plan(Candidates(ids, probs), n_masks, nodes, groups)
    return build_window([plan], [[pad_id]], nodes, groups, mask_id, pad_id, "cpu")


def profiled(fn, repeats: int, top: int) -> str:
    """The profiler's top operators by self CPU time over `repeats` calls of compiled `fn`."""
    fn(), fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def measure(ar_model, mars_model, mask_id: int, pad_id: int, *, block_size: int, nodes: int, groups: int,
            context: int, repeats: int, compile: bool = True, profile: int = 0) -> dict[str, float]:
    M = block_size - 1
    w = window_of(nodes, groups, M, mask_id, pad_id)
    cursor, window = torch.tensor([context]), 1 << (context + w.ids.shape[1]).bit_length()
    rest = dict(remaining=torch.tensor([1000]), alive=torch.tensor([True]), stop_ids=torch.tensor([-1]))

    def cache(model):
        state = static_state(model)
        return state.take(1, window, state.kv_layout(model, mask_id, pad_id))

    run = (lambda f: torch.compile(f, dynamic=False, fullgraph=True)) if compile else (lambda f: f)
    ar_cache, mars_cache = cache(ar_model), cache(mars_model)
    one, at = torch.tensor([[pad_id]]), torch.tensor([[context]])

    def step_on(model, kv):
        return lambda: window_step(model, kv, w, cursor, **rest, n_masks=M, depth=M, topk=8,
                                   max_accept=None, metric="probability", window=window)

    step = step_on(mars_model, mars_cache)
    rows = {
        "ar": lambda: _forward(ar_model, ar_cache, one, at, torch.tensor([[0]]), window),
        "window": lambda: window_forward(ar_model, ar_cache, w, cursor, M, window),
        # the same step on the AR model: what verification and the path's move add to the window,
        # so that `step` minus this row is what the gate costs
        "step on the AR model": step_on(ar_model, ar_cache),
        "step": step,
    }
    out = {}
    with torch.no_grad():
        compiled = {name: run(fn) for name, fn in rows.items()}  # compiled on first call, once
        for name, fn in compiled.items():
            out[name] = timed(fn, repeats)
        if profile:
            for name in ("step on the AR model", "step"):
                print(f"## {name}: top {profile} operators by self CPU time over {repeats} calls\n"
                      + profiled(compiled[name], repeats, profile))
        stacked = [m for m in wrapped_layers(mars_model).values() if m.siblings is not None]
        if stacked:
            groups = [m.siblings for m in stacked]
            torch._dynamo.reset()  # the unstacked form is another graph
            for m in stacked:
                m.siblings = None
            try:
                out["step, adapters unstacked"] = timed(run(step), repeats)
            finally:
                for m, g in zip(stacked, groups):
                    m.siblings = g
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ar-model", required=True)
    p.add_argument("--mars-model", required=True)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--prepack", action="store_true", help="both models on oneDNN's prepacked linear (mars_core.cpu)")
    p.add_argument("--draft", default="6,2", help="nodes,groups of the step's window (default 6,2)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--context", type=int, default=200, help="cached tokens before the window")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--eager", action="store_true", help="no torch.compile (a quick check of the harness)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print the top N operators of both steps under torch.profiler")
    args = p.parse_args(argv)
    try:
        nodes, groups = (int(x) for x in args.draft.split(","))
        if nodes < 1 or groups < 1:
            raise ValueError
    except ValueError:
        p.error(f"--draft must be two integers >= 1, nodes,groups such as 6,2; got {args.draft!r}")
    ar_model, tok = load_model(args.ar_model, dtype=args.dtype, prepack=args.prepack)
    mars_model, mtok = load_model(args.mars_model, dtype=args.dtype, prepack=args.prepack)
    times = measure(ar_model, mars_model, mtok.mask_token_id, tok.pad_token_id or 0, block_size=args.block_size, nodes=nodes,
                    groups=groups, context=args.context, repeats=args.repeats, compile=not args.eager,
                    profile=args.profile)
    print(f"| compiled: {not args.eager}, {args.dtype}, prepack {args.prepack}, window of {nodes} nodes and {groups} "
          f"groups, {args.context} cached tokens, {torch.get_num_threads()} threads | ms | x ar |\n|---|---:|---:|")
    for name, ms in times.items():
        print(f"| {name} | {ms:.1f} | {ms / times['ar']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
