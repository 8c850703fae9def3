"""Measurement: every method on the same prompts, warmed up, timed in interleaved repetitions, scored.

Interleaved at the finest grain that keeps a method's own batching: in each repetition, every
chunk of prompts (one batch) is decoded by every method in turn, the order rotating from chunk to
chunk and repetition to repetition, and a method's time is the sum over its chunks. A drift of the
machine slower than one chunk (another job, throttling, a noisy neighbour of a shared VM, whose
speed moved up to 2x within a minute here: docs/exact.md) then hits every method alike; run by
run, it did not. The reported wall-clock is the median over the repetitions. Counts exclude prompt
tokens and EOS.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import torch

from mars_core.loading import load_model
from mars_core.prompts import check_context, encode_prompt
from tasks.synthetic import make_examples, score

from .methods import CallCounter, Method, ar_baselines, method_list

DEFAULT_AR = "assets/models/tiny-ar-sft"
DEFAULT_MARS = "assets/models/tiny-mars-b4"
DEFAULT_DRAFT = "assets/models/tiny-draft"  # the bundled small draft (training.build_default)


def run_all(method: Method, model, tok, ids: list[list[int]], batch_size: int, tau: float, args):
    """Every prompt, in chunks of `batch_size`; returns a measurement dict."""
    total = _empty()
    for i in range(0, len(ids), batch_size):
        _add(total, run_chunk(method, model, tok, ids[i:i + batch_size], tau, args))
    return total


def run_chunk(method: Method, model, tok, chunk: list[list[int]], tau: float, args) -> dict:
    """One batch of prompts, timed; a measurement dict."""
    counter = CallCounter(model, hook=not method.compile)
    try:
        t0 = time.perf_counter()
        tokens, row_forwards = method.run(method, model, tok, chunk, tau, args, counter)
        seconds = time.perf_counter() - t0
    finally:
        counter.remove()
    return {"seconds": seconds, "ids": list(tokens), "row_forwards": row_forwards, "calls": counter.n}


def _empty() -> dict:
    return {"seconds": 0.0, "ids": [], "row_forwards": 0, "calls": 0}


def _add(total: dict, part: dict) -> None:
    for k in total:
        total[k] += part[k]


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def load_prompts(args) -> list[dict]:
    """[{"prompt": str, "answer": str | None}]"""
    if not args.prompts:
        return [{"prompt": ex["messages"][0]["content"], "answer": ex["answer"]}
                for ex in make_examples(args.n, args.seed, "eval")]
    out = []
    try:
        with open(args.prompts, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                if isinstance(rec, dict) and "messages" in rec:
                    prompt = next(m["content"] for m in rec["messages"] if m.get("role") == "user")
                elif isinstance(rec, dict) and isinstance(rec.get("prompt"), str):
                    prompt = rec["prompt"]
                else:
                    raise ValueError(f"line {n}: expected {{\"prompt\": ...}} or {{\"messages\": [...]}}")
                if not prompt.strip():
                    raise ValueError(f"line {n}: empty prompt")
                out.append({"prompt": prompt, "answer": rec.get("answer")})
    except OSError as e:
        raise ValueError(f"cannot read --prompts {args.prompts!r}: {e}") from None
    except (json.JSONDecodeError, StopIteration, KeyError, TypeError) as e:
        raise ValueError(f"--prompts {args.prompts!r} is not valid JSONL prompts: {e}") from None
    if not out:
        raise ValueError(f"--prompts {args.prompts!r} holds no prompts")
    return out[: args.n]


def _load_models(methods: list[Method], args) -> dict:
    models = {}
    for kind, path, default in (("ar", args.ar_model, DEFAULT_AR), ("mars", args.mars_model, DEFAULT_MARS)):
        if kind not in {m.model for m in methods}:
            continue
        if path == default and not os.path.isdir(path):
            raise ValueError(f"the default {kind} model {path!r} is not built yet: run "
                             f"`python -m training.build_default`, or pass --{kind}-model")
        models[kind] = load_model(path, device=args.device, dtype=getattr(torch, args.dtype),  # as asked, bf16 even where emulated
                                  prepack=args.prepack)
        if args.prepack and models[kind][0].mars_dtype_note:  # asked to pack and could not: not the run asked for
            raise ValueError(f"--prepack: {models[kind][0].mars_dtype_note}")
    return models


def _check_fits(models: dict, ids: dict, args) -> None:
    for k, (model, _) in models.items():
        try:  # AR methods read one position past the text, MARS ones a block
            check_context(model, ids[k], args.max_new_tokens, args.block_size if k == "mars" else 1)
        except ValueError as e:
            raise ValueError(f"the {k} model: {e}") from None


def _attempt(m: Method, fn):
    """Run `fn()`; an optional method that fails is marked "not available", any other re-raises."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - an optional method that fails is reported, not fatal
        if not m.optional:
            raise
        m.state["error"] = _reason(e)
        return None


class _GraphCount:
    """Adds to `method.state[key]` the graphs torch.compile built while the block ran (all
    methods' compiles go through one process-wide counter; methods run one at a time)."""

    def __init__(self, method: Method, key: str):
        self.method, self.key = method, key

    @staticmethod
    def graphs() -> int:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]

    def __enter__(self):
        self.before = self.graphs()

    def __exit__(self, *exc):
        self.method.state[self.key] = self.method.state.get(self.key, 0) + self.graphs() - self.before


def _measure_batch(runs, models, ids, bs: int, args) -> dict:
    """Warm-up, then `args.repeats` interleaved repetitions; {(name, tau): [run_all dicts]}."""
    # warm-up: the first chunk of every run; for compile every chunk, so that every shape
    # it will be timed on is compiled before the clock runs
    for m, _ in runs:
        m.state.pop("graphs_warmup", None), m.state.pop("graphs_timed", None)
    for m, tau in runs:
        model, tok = models[m.model]
        warm = ids[m.model] if m.warm_every_chunk else ids[m.model][:bs]
        with _GraphCount(m, "graphs_warmup"):
            _attempt(m, lambda: run_all(m, model, tok, warm, bs, tau or 0.0, args))
    measured = {(m.name, tau): [] for m, tau in runs}
    n = len(next(iter(ids.values())))
    for rep in range(args.repeats):
        print(f"[bench] batch {bs}: repetition {rep + 1}/{args.repeats} of {len(runs)} runs",
              file=sys.stderr, flush=True)  # progress on stderr; the table goes to stdout
        totals = {(m.name, tau): _empty() for m, tau in runs}
        for c, start in enumerate(range(0, n, bs)):
            k = (rep + c) % len(runs)
            for m, tau in runs[k:] + runs[:k]:  # every method on this chunk, the order rotating
                if "error" in m.state:
                    continue
                model, tok = models[m.model]
                chunk = ids[m.model][start:start + bs]
                with _GraphCount(m, "graphs_timed"):
                    got = _attempt(m, lambda: run_chunk(m, model, tok, chunk, tau or 0.0, args))
                if got is not None:
                    _add(totals[(m.name, tau)], got)
        for m, tau in runs:
            if "error" not in m.state:  # a method that failed mid-repetition has no whole measurement
                measured[(m.name, tau)].append(totals[(m.name, tau)])
    return measured


def _row(m: Method, tau, bs: int, reps: list[dict], tok, items: list[dict]) -> dict:
    row = {"batch_size": bs, "method": m.name, "model": m.model, "tau": tau, "cache": m.cache,
           "cache_block_size": m.cache_block_size}
    if "error" in m.state:
        return dict(row, status="not available", reason=m.state["error"])
    first = reps[0]
    seconds = statistics.median(r["seconds"] for r in reps)
    tokens = sum(len(t) for t in first["ids"])
    texts = tok.batch_decode(first["ids"], skip_special_tokens=True)
    scored = [score(t, it["answer"]) for t, it in zip(texts, items) if it["answer"] is not None]
    return dict(
        row, status="ok", seconds=seconds, seconds_all=[r["seconds"] for r in reps], tokens=tokens,
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
        tokens_per_forward=tokens / first["row_forwards"] if first["row_forwards"] else 0.0,
        model_calls=first["calls"], accuracy=(sum(scored) / len(scored)) if scored else None,
        deterministic=all(r["ids"] == first["ids"] for r in reps), _ids=first["ids"],
        graphs_warmup=m.state.get("graphs_warmup", 0), graphs_timed=m.state.get("graphs_timed", 0),
        _text0=texts[0] if texts else "", _baseline=m.baseline, _reference=m.reference, _exact=m.exact)


def benchmark(args) -> dict:
    """Run the benchmark the CLI args describe; returns the result (what bench.json holds)."""
    methods = method_list(args.methods, args.cache_block_sizes)
    for m in methods:
        if m.cache == "block" and m.cache_block_size < args.block_size:
            raise ValueError(f"{m.name}: cache block size {m.cache_block_size} < block size {args.block_size}")
    models = _load_models(methods, args)
    items = load_prompts(args)
    ids = {k: [encode_prompt(tok, it["prompt"]) for it in items] for k, (_, tok) in models.items()}
    _check_fits(models, ids, args)

    results = []
    for bs in args.batch_sizes:
        runs = [(m, None) for m in methods if not m.uses_tau]
        runs += [(m, tau) for tau in args.taus for m in methods if m.uses_tau]
        measured = _measure_batch(runs, models, ids, bs, args)
        results += [_row(m, tau, bs, measured[(m.name, tau)], models[m.model][1], items) for m, tau in runs]
    compare(results)
    notes = [n for n in dict.fromkeys(m.note(args) for m in methods if m.note) if n]
    notes += [n for m in methods for n in m.state.get("notes", [])]  # what a method decided while it ran
    notes.append("Methods may stop at EOS at different points: speed is compared as tokens/s, and speed-up is "
                 "tokens/s over the fastest AR-with-KV-cache row (" + ", ".join(ar_baselines()) +
                 ") at the same batch size.")
    notes.append("T/F: generated tokens per forward per sequence (the paper's measure); calls: model forward "
                 "calls of one repetition, prefill included.")
    return {
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k != "func"},
        "environment": _environment(args),
        "n_prompts": len(items), "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in results],
        "samples": [{"method": r["method"], "tau": r["tau"], "batch_size": r["batch_size"], "output": r["_text0"]}
                    for r in results if r.get("status") == "ok" and r["batch_size"] == args.batch_sizes[0]],
        "notes": notes,
    }


def _environment(args) -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "device": args.device, "dtype": args.dtype, "cpu_count": os.cpu_count(),
            "prepack": args.prepack,
            "platform": platform.platform()}


def compare(results: list[dict]) -> None:
    """Adds `speedup`, `baseline` and `same_as_ref` to the measured rows.

    Speed-up is tokens/s over the fastest baseline row (AR with KV cache) at the same batch size;
    `same_as_ref` is the fraction of prompts whose output equals, token for token, the reference
    of its model (the AR reference; for MARS the reference row at the same tau, and for the exact
    rows, lossless and speculative, the MARS model's AR reference whatever their tau).
    """
    ok = [r for r in results if r.get("status") == "ok"]
    for bs in {r["batch_size"] for r in ok}:
        group = [r for r in ok if r["batch_size"] == bs]
        bases = [r for r in group if r["_baseline"]]
        base = max(bases, key=lambda r: r["tokens_per_second"]) if bases else None
        refs = {}
        for r in group:
            if r["_reference"]:
                refs.setdefault((r["model"], r["tau"] if r["model"] == "mars" else None), r)
        for r in group:
            r["baseline"] = base["method"] if base else None
            r["speedup"] = r["tokens_per_second"] / base["tokens_per_second"] if base and base["tokens_per_second"] else None
            ref_tau = r["tau"] if r["model"] == "mars" and not r.get("_exact") else None  # exact rows: AR's output
            ref = refs.get((r["model"], ref_tau))
            r["same_as_ref"] = (sum(a == b for a, b in zip(r["_ids"], ref["_ids"])) / len(ref["_ids"])
                                if ref is not None and ref["_ids"] else None)
