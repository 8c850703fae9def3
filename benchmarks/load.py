"""Serving under load, in one process: requests arrive by a seeded process while the model decodes.

    python -m benchmarks.load --output runs/load       # bursty, 7.5 requests/s in the burst, 4 slots
    python -m benchmarks.load --pattern steady --rate 5 --policies 1.0,0.95 --slots 1,4,8 --output runs/batching

Held-out synthetic problems (`tasks.synthetic`, eval split) arrive by a seeded Poisson process:
"steady" at `rate` requests/s for `duration` seconds, or "bursty": a quiet third at
`rate * quiet_ratio`, a burst third at `rate`, a quiet third again. Every policy (fixed tau
values, `adaptive`) and every slot count serves the SAME requests at the SAME arrival times
through `mars_core.serving.Batcher` (continuous batching on the cursor cache); slots = 1 is
one-at-a-time decoding.

The clock (`--clock`, see `benchmarks.load_sim`): "measured" (default) advances by the measured
wall time of every server step and skips idle gaps; "wall" is the real clock, sleeping when
idle. Forward times are real either way: run timed comparisons under
`flock /tmp/cpu-bench.lock` and repeat them (`--repeats`, rotated order).

Bounded: at most `max_requests` requests, arriving within `duration` seconds of the clock; a run
that is still going after `time_limit` wall seconds stops and reports the unfinished requests.
"""
from __future__ import annotations

import math
import statistics

from benchmarks.load_sim import LoadSettings, arrivals, phases, simulate, summarise


# ---------------------------------------------------------------------------------------------
# policies, the whole comparison
# ---------------------------------------------------------------------------------------------


def parse_policy(spec: str, metric: str = "probability") -> str:
    """Canonical name of a policy spec: "adaptive", or "fixed <tau>" from "0.95" / "fixed-0.95"."""
    from mars_core.config import check_tau

    text = str(spec).strip().lower()
    if text == "adaptive":
        return "adaptive"
    number = text.removeprefix("fixed").strip(" -=")
    try:
        tau = float(number)
    except ValueError:
        raise ValueError(f"unknown policy {spec!r}; use adaptive or a fixed tau (e.g. 0.95 or fixed-0.95)") from None
    return f"fixed {check_tau(tau, metric):g}"


def make_policy(name: str, adaptive):
    from mars_core.tau_policy import AdaptiveTau, FixedTau

    if name == "adaptive":
        return AdaptiveTau(adaptive)
    return FixedTau(float(name.split()[1]), adaptive.metric)


def _thin(steps: list[dict], most: int = 1500) -> list[dict]:
    k = max(1, math.ceil(len(steps) / most))
    return steps[::k]


def run_load(model, tok, settings: LoadSettings, policies: list[str], slots: list[int], adaptive,
             block_size: int = 4, max_new_tokens: int = 256, repeats: int = 1, progress=None) -> dict:
    """Every policy at every slot count on the same arrivals, `repeats` times in rotated order.

    `adaptive` is the `AdaptiveConfig` of the adaptive policy; its latency_target is also the
    target the p95 latency is judged against. Returns settings, per-run summaries and records.
    """
    from mars_core.config import DecodeConfig
    from mars_core.prompts import encode_prompt
    from mars_core.serving import Batcher, Request
    from tasks.synthetic import make_examples, score

    names = [parse_policy(p, adaptive.metric) for p in policies]
    if not names or not slots or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in slots):
        raise ValueError(f"give at least one policy and slot counts >= 1, got {policies!r} and {slots!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    arr = arrivals(settings)
    if not arr:
        raise ValueError("no request arrives in that time at that rate: raise --rate or --duration")
    examples = make_examples(len(arr), settings.seed, "eval")
    prompts = [encode_prompt(tok, ex["messages"][0]["content"]) for ex in examples]
    times = [t for t, _ in arr]
    cfg = DecodeConfig(block_size=block_size, max_new_tokens=max_new_tokens, metric=adaptive.metric)
    warm = Batcher(model, tok, cfg, slots=max(slots), policy=make_policy("fixed 1", adaptive))
    for p in prompts[:4]:  # warm-up: the first forwards of a process are slow
        warm.submit(Request(p, 16))
    for _ in warm.run():
        pass
    runs = [(name, s) for s in slots for name in names]
    records = {(name, s): [] for name, s in runs}
    total, k = len(runs) * repeats, 0
    for rep in range(repeats):
        order = runs[rep % len(runs):] + runs[:rep % len(runs)]
        for name, s in order:
            def step_progress(frac, text, k=k, name=name, s=s):
                if progress is not None:
                    progress((k + frac) / total, f"{name}, {s} slot{'s' * (s > 1)}: {text}")

            batcher = Batcher(model, tok, cfg, slots=s, policy=make_policy(name, adaptive))
            raw = simulate(batcher, prompts, times, settings, max_new_tokens, step_progress)
            texts = [tok.decode(o, skip_special_tokens=True) if o is not None else None for o in raw["outs"]]
            correct = [score(t, ex["answer"]) if t is not None else None for t, ex in zip(texts, examples)]
            summary = summarise(raw, arr, texts, correct, adaptive.latency_target)
            per_request = [{"arrival": a, "phase": ph, "latency": None if f is None else f - a,
                            "ttft": None if ft is None else ft - a, "tokens": None if o is None else len(o),
                            "mean_tau": statistics.fmean(tt) if tt else None, "correct": c}
                           for (a, ph), f, ft, o, tt, c in zip(arr, raw["finish"], raw["first"], raw["outs"],
                                                               raw["taus"], correct)]
            records[(name, s)].append({"summary": summary, "steps": _thin(raw["steps"]), "requests": per_request})
            k += 1
    results = []
    for name, s in runs:
        reps = records[(name, s)]
        keys = ("p50_ttft", "p95_ttft", "p50_latency", "p95_latency", "tokens_per_second", "tokens_per_forward",
                "accuracy", "mean_tau")
        med = {key: _median([r["summary"][key] for r in reps]) for key in keys}
        mid = min(reps, key=lambda r: abs((r["summary"]["p95_latency"] or 0) - (med["p95_latency"] or 0)))
        results.append({"policy": name, "slots": s, **mid["summary"], **med,
                        "meets_target": med["p95_latency"] is not None and med["p95_latency"] <= adaptive.latency_target
                        and not any(r["summary"]["stopped_by_time_limit"] for r in reps),
                        "repeats": [r["summary"] for r in reps], "steps": mid["steps"], "per_request": mid["requests"]})
    return {"settings": {**vars(settings), "policies": names, "slots": slots, "block_size": block_size,
                         "max_new_tokens": max_new_tokens, "repeats": repeats, "target": adaptive.latency_target,
                         "adaptive": vars(adaptive)},
            "phases": [{"name": n, "start": a, "end": b, "rate": r} for n, a, b, r in phases(settings)],
            "results": results}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

DEFAULT_MODEL = "assets/models/tiny-mars-b4"


def parser():
    import argparse

    from mars_core.tau_policy import AdaptiveConfig

    p = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"MARS model folder or hub id (default {DEFAULT_MODEL})")
    p.add_argument("--pattern", default="bursty", help="steady or bursty (default bursty)")
    p.add_argument("--rate", type=float, default=7.5, help="requests/s: steady rate, or the burst's (default 7.5)")
    p.add_argument("--quiet-ratio", type=float, default=0.25, help="bursty: quiet rate / burst rate (default 0.25)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (default 60)")
    p.add_argument("--max-requests", type=int, default=600, help="at most this many requests (default 600)")
    p.add_argument("--seed", type=int, default=0, help="arrivals and problems (default 0)")
    p.add_argument("--policies", default="1.0,0.95,0.7,adaptive",
                   help="comma-separated fixed taus and/or adaptive (default 1.0,0.95,0.7,adaptive)")
    p.add_argument("--slots", default="4", help="comma-separated batch slots; 1 = one at a time (default 4)")
    p.add_argument("--target", type=float, default=2.0, help="p95 latency target, seconds (default 2)")
    d = AdaptiveConfig()
    p.add_argument("--tau-min", type=float, default=d.tau_min, help=f"adaptive: loosest tau (default {d.tau_min:g})")
    p.add_argument("--tau-max", type=float, default=d.tau_max, help=f"adaptive: strictest tau (default {d.tau_max:g})")
    p.add_argument("--tau-step", type=float, default=d.step, help=f"adaptive: ladder spacing (default {d.step:g})")
    p.add_argument("--high", type=float, default=d.high,
                   help=f"adaptive: relax at expected latency >= high x target (default {d.high:g})")
    p.add_argument("--low", type=float, default=d.low,
                   help=f"adaptive: tighten at predicted latency <= low x target (default {d.low:g})")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per request (default 256)")
    p.add_argument("--clock", default="measured", help="measured (default) or wall; see above")
    p.add_argument("--time-limit", type=float, default=300.0, help="wall seconds per run before it stops (default 300)")
    p.add_argument("--repeats", type=int, default=1, help="repetitions of every run, rotated order (default 1)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared CPU, threads stall at each other's barriers "
                        "whenever another job holds a core, so a forward's time would measure the load of "
                        "the machine, not the decoder)")
    p.add_argument("--png", action="store_true", help="also write the figures as PNG (needs kaleido and Chrome)")
    p.add_argument("--output", default="load", help="folder for load.md, load.json and the figures (default ./load)")
    return p


def settings_from(a):
    """(LoadSettings, AdaptiveConfig, policies, slots) from parsed arguments; ValueError if bad."""
    from mars_core.lists import parse_list
    from mars_core.tau_policy import AdaptiveConfig

    settings = LoadSettings(pattern=a.pattern, rate=a.rate, quiet_ratio=a.quiet_ratio, duration=a.duration,
                            max_requests=a.max_requests, seed=a.seed, clock=a.clock, time_limit=a.time_limit)
    adaptive = AdaptiveConfig(tau_min=a.tau_min, tau_max=a.tau_max, step=a.tau_step, latency_target=a.target,
                              high=a.high, low=a.low)
    policies = list(parse_list(a.policies, str, name="--policies"))
    for x in policies:
        parse_policy(x)
    slots = list(parse_list(a.slots, int, minimum=1, name="--slots"))
    for name, lo in (("max_new_tokens", 1), ("repeats", 1), ("threads", 1)):
        if getattr(a, name) < lo:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(a, name)}")
    return settings, adaptive, policies, slots


def main(argv: list[str] | None = None) -> int:
    import sys

    import torch

    p = parser()
    a = p.parse_args(argv)
    try:
        settings, adaptive, policies, slots = settings_from(a)
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(a.threads)
    from mars_core.loading import trained_block_size
    from benchmarks.load_report import table, write_outputs
    from mars_core.loading import load_model

    def progress(frac, text):
        print(f"[load] {100 * frac:5.1f}% {text}", file=sys.stderr, flush=True)

    try:
        model, tok = load_model(a.model)
        block = trained_block_size(a.model) or 4
        result = run_load(model, tok, settings, policies, slots, adaptive, block, a.max_new_tokens, a.repeats, progress)
        result["environment"] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "model": a.model}
        paths = write_outputs(result, a.output, png=a.png)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(result))
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
