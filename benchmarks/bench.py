"""Decoding speed benchmark: AR baselines against MARS with every KV-cache mode, in one run.

    python -m benchmarks.bench --output runs/bench
    python -m benchmarks.bench --ar-model A --mars-model M --batch-sizes 1,8 --taus 0.95,0.8 --output out/

Every method decodes the same prompts (default: held-out synthetic problems) with the same
`max_new_tokens`, greedy. Methods are timed in one process, after a warm-up, interleaved: each
repetition runs every method once, in a rotated order, so that a drift of the machine (another
job, thermal throttling) hits all of them alike. The reported wall-clock is the median over the
repetitions. Counts exclude prompt tokens and EOS.

Methods (AR ones on the AR model, MARS ones on the MARS model):

  hf-generate        `model.generate(do_sample=False)`, HF's dynamic KV cache (what users know)
  ar                 our AR decoder (`mode="ar"`, sliding KV cache)
  ar-cursor          our AR decoder with the cursor KV cache
  hf-prompt-lookup   `model.generate(prompt_lookup_num_tokens=K)`; HF runs it at batch 1 only,
                     so a batch is decoded one prompt after the other
  ar-static-compile  `model.generate(cache_implementation="static")` + `torch.compile`;
                     reported as "not available" (with the reason) where it fails
  mars-nocache       MARS, no KV cache (full recompute each step)
  mars-sliding       MARS, sliding KV cache
  mars-block-<Bc>    MARS, the paper's block-level cache, cache block size Bc
  mars-cursor        MARS, the cursor KV cache (no block synchronisation)

Speed-up is tokens/s over the AR-with-KV-cache baseline: the fastest of hf-generate, ar and
ar-cursor at the same batch size. Methods can stop at EOS at different points, so speed is
compared as tokens/s (not as wall-clock). `= ref` is the fraction of prompts whose output equals,
token for token, the reference of its model: hf-generate for the AR model, mars-nocache (same
tau) for the MARS model. Outputs: bench.md (the table), bench.json, bench.html (plotly).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

DEFAULT_AR = "assets/models/tiny-ar-sft"
DEFAULT_MARS = "assets/models/tiny-mars-b4"
AR_BASELINES = ("hf-generate", "ar", "ar-cursor")
FIXED_METHODS = ("hf-generate", "ar", "ar-cursor", "hf-prompt-lookup", "ar-static-compile",
                 "mars-nocache", "mars-sliding", "mars-cursor")


@dataclass
class Method:
    name: str
    model: str  # "ar" or "mars"
    kind: str  # "hf", "hf-lookup", "hf-compile", "ours"
    cache: str | None = None
    cache_block_size: int | None = None
    uses_tau: bool = False
    state: dict = field(default_factory=dict)  # e.g. {"error": "..."} once it has failed


def method_list(names: list[str], cache_block_sizes: tuple[int, ...]) -> list[Method]:
    out = []
    for name in names:
        if name == "hf-generate":
            out.append(Method(name, "ar", "hf"))
        elif name == "ar":
            out.append(Method(name, "ar", "ours", "sliding"))
        elif name == "ar-cursor":
            out.append(Method(name, "ar", "ours", "cursor"))
        elif name == "hf-prompt-lookup":
            out.append(Method(name, "ar", "hf-lookup"))
        elif name == "ar-static-compile":
            out.append(Method(name, "ar", "hf-compile"))
        elif name == "mars-nocache":
            out.append(Method(name, "mars", "ours", "none", uses_tau=True))
        elif name == "mars-sliding":
            out.append(Method(name, "mars", "ours", "sliding", uses_tau=True))
        elif name == "mars-cursor":
            out.append(Method(name, "mars", "ours", "cursor", uses_tau=True))
        elif name == "mars-block":
            out += [Method(f"mars-block-{c}", "mars", "ours", "block", c, uses_tau=True) for c in cache_block_sizes]
        elif name.startswith("mars-block-") and name[len("mars-block-"):].isdigit():
            out.append(Method(name, "mars", "ours", "block", int(name[len("mars-block-"):]), uses_tau=True))
        else:
            raise ValueError(f"unknown method {name!r}; allowed: {', '.join(FIXED_METHODS)}, mars-block, mars-block-<N>")
    return out


# ---------------------------------------------------------------------------------------------
# running one method on one chunk of prompts
# ---------------------------------------------------------------------------------------------


class CallCounter:
    """Counts the model's forward calls (prefill included) with a forward pre-hook."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1


def _cut(ids: list[int], stop: set[int]) -> tuple[list[int], bool]:
    for j, t in enumerate(ids):
        if t in stop:
            return ids[:j], True
    return ids, False


def _hf_batch(model, ids: list[list[int]], pad_id: int, stop: list[int], max_new: int, **kw):
    """HF generate on a left-padded batch; returns per-row ids (EOS cut) and row forwards."""
    width = max(len(i) for i in ids)
    x = torch.full((len(ids), width), pad_id, dtype=torch.long)
    am = torch.zeros((len(ids), width), dtype=torch.long)
    for r, seq in enumerate(ids):
        x[r, width - len(seq):] = torch.tensor(seq)
        am[r, width - len(seq):] = 1
    dev = next(model.parameters()).device
    out = model.generate(x.to(dev), attention_mask=am.to(dev), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=pad_id, eos_token_id=stop, **kw)[:, width:].tolist()
    tokens, row_forwards = [], 0
    for row in out:
        got, hit = _cut(row, set(stop))
        tokens.append(got)
        row_forwards += len(got) + int(hit)  # greedy AR: one token (or the EOS) per forward
    return tokens, row_forwards


def run_chunk(method: Method, model, tok, ids: list[list[int]], tau: float, args, counter: CallCounter):
    """Decode one chunk; returns (token ids per prompt, row forwards)."""
    from mars_core.config import DecodeConfig
    from mars_core.generate import decode_steps
    from mars_core.prompts import special_ids

    _, pad_id, stop = special_ids(model, tok)
    if method.kind == "hf":
        return _hf_batch(model, ids, pad_id, stop, args.max_new_tokens)
    if method.kind == "hf-lookup":  # HF assisted generation runs at batch 1 only
        tokens, row_forwards = [], 0
        for seq in ids:
            before = counter.n
            got, _ = _hf_batch(model, [seq], pad_id, stop, args.max_new_tokens,
                               prompt_lookup_num_tokens=args.prompt_lookup_tokens)
            tokens += got
            row_forwards += counter.n - before
        return tokens, row_forwards
    if method.kind == "hf-compile":
        from transformers import CompileConfig

        if "compile_config" not in method.state:
            cc = CompileConfig(fullgraph=False, dynamic=None, mode="default")
            cc._compile_all_devices = True  # HF auto-compiles on accelerators only; we want the CPU too
            method.state["compile_config"] = cc
        return _hf_batch(model, ids, pad_id, stop, args.max_new_tokens, cache_implementation="static",
                         compile_config=method.state["compile_config"])
    mode = "ar" if method.model == "ar" else "mars"
    cfg = DecodeConfig(mode=mode, tau=tau if mode == "mars" else 1.0, block_size=args.block_size,
                       cache=method.cache, cache_block_size=method.cache_block_size or 16,
                       metric=args.metric, max_new_tokens=args.max_new_tokens)
    rows, steps = decode_steps(model, tok, ids, cfg)
    for _ in steps:
        pass
    return rows.out, rows.stats.row_forwards


def run_all(method: Method, model, tok, ids: list[list[int]], batch_size: int, tau: float, args):
    """Every prompt, in chunks of `batch_size`; returns a measurement dict."""
    counter = CallCounter(model)
    try:
        t0 = time.perf_counter()
        tokens, row_forwards = [], 0
        for i in range(0, len(ids), batch_size):
            got, rf = run_chunk(method, model, tok, ids[i:i + batch_size], tau, args, counter)
            tokens += got
            row_forwards += rf
        seconds = time.perf_counter() - t0
    finally:
        counter.handle.remove()
    return {"seconds": seconds, "ids": tokens, "row_forwards": row_forwards, "calls": counter.n}


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------


OPTIONAL_KINDS = ("hf-compile", "hf-lookup")  # HF features that may not work everywhere


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def load_prompts(args) -> list[dict]:
    """[{"prompt": str, "answer": str | None}]"""
    if args.prompts:
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
    from tasks.synthetic import make_examples

    return [{"prompt": ex["messages"][0]["content"], "answer": ex["answer"]}
            for ex in make_examples(args.n, args.seed, "eval")]


def _block_size_of(path: str) -> int | None:
    try:
        with open(os.path.join(path, "training_config.json"), encoding="utf-8") as f:
            return int(json.load(f)["args"]["block_size"])
    except Exception:  # noqa: BLE001 - a hub model or an untrained folder: use the default
        return None


def benchmark(args) -> dict:
    from tasks.synthetic import score

    from mars_core.loading import load_model
    from mars_core.prompts import encode_prompt

    methods = method_list(args.methods, args.cache_block_sizes)
    for m in methods:
        if m.cache == "block" and m.cache_block_size < args.block_size:
            raise ValueError(f"{m.name}: cache block size {m.cache_block_size} < block size {args.block_size}")
    models = {}
    for kind, path, default in (("ar", args.ar_model, DEFAULT_AR), ("mars", args.mars_model, DEFAULT_MARS)):
        if kind not in {m.model for m in methods}:
            continue
        if path == default and not os.path.isdir(path):
            raise ValueError(f"the default {kind} model {path!r} is not built yet: run "
                             f"`python -m training.build_default`, or pass --{kind}-model")
        models[kind] = load_model(path, device=args.device, dtype=args.dtype)
    items = load_prompts(args)
    ids = {k: [encode_prompt(tok, it["prompt"]) for it in items] for k, (_, tok) in models.items()}
    for k, (model, _) in models.items():
        limit = getattr(model.config, "max_position_embeddings", None)
        longest = max(len(i) for i in ids[k])
        if limit is not None and longest + args.max_new_tokens + args.block_size > limit:
            raise ValueError(f"the {k} model has {limit} positions; the longest prompt ({longest} tokens) plus "
                             f"--max-new-tokens {args.max_new_tokens} does not fit")

    results, notes = [], []
    for bs in args.batch_sizes:
        runs = [(m, None) for m in methods if not m.uses_tau]
        runs += [(m, tau) for tau in args.taus for m in methods if m.uses_tau]
        # warm-up: the first chunk of every run; for compile every chunk, so that every shape
        # it will be timed on is compiled before the clock runs
        for m, tau in runs:
            model, tok = models[m.model]
            warm = ids[m.model] if m.kind == "hf-compile" else ids[m.model][:bs]
            try:
                run_all(m, model, tok, warm, bs, tau or 0.0, args)
            except Exception as e:  # noqa: BLE001 - an optional method that fails is reported, not fatal
                if m.kind not in OPTIONAL_KINDS:
                    raise
                m.state["error"] = _reason(e)
        measured = {(m.name, tau): [] for m, tau in runs}
        for rep in range(args.repeats):
            print(f"[bench] batch {bs}: repetition {rep + 1}/{args.repeats} of {len(runs)} runs",
                  file=sys.stderr, flush=True)  # progress on stderr; the table goes to stdout
            k = rep % len(runs)
            for m, tau in runs[k:] + runs[:k]:  # rotate the order every repetition
                if "error" in m.state:
                    continue
                model, tok = models[m.model]
                try:
                    measured[(m.name, tau)].append(run_all(m, model, tok, ids[m.model], bs, tau or 0.0, args))
                except Exception as e:  # noqa: BLE001 - as in the warm-up
                    if m.kind not in OPTIONAL_KINDS:
                        raise
                    m.state["error"] = _reason(e)
        for m, tau in runs:
            row = {"batch_size": bs, "method": m.name, "model": m.model, "tau": tau, "cache": m.cache,
                   "cache_block_size": m.cache_block_size}
            if "error" in m.state:
                results.append(dict(row, status="not available", reason=m.state["error"]))
                continue
            reps = measured[(m.name, tau)]
            first = reps[0]
            seconds = statistics.median(r["seconds"] for r in reps)
            tokens = sum(len(t) for t in first["ids"])
            texts = models[m.model][1].batch_decode(first["ids"], skip_special_tokens=True)
            scored = [score(t, it["answer"]) for t, it in zip(texts, items) if it["answer"] is not None]
            results.append(dict(
                row, status="ok", seconds=seconds, seconds_all=[r["seconds"] for r in reps], tokens=tokens,
                tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
                tokens_per_forward=tokens / first["row_forwards"] if first["row_forwards"] else 0.0,
                model_calls=first["calls"], accuracy=(sum(scored) / len(scored)) if scored else None,
                deterministic=all(r["ids"] == first["ids"] for r in reps), _ids=first["ids"],
                _text0=texts[0] if texts else ""))
    _compare(results)
    if any(m.kind == "hf-lookup" for m in methods) and max(args.batch_sizes) > 1:
        notes.append("hf-prompt-lookup: HF assisted generation supports batch size 1 only; at batch > 1 the "
                     "prompts of a batch are decoded one after the other.")
    notes.append("Methods may stop at EOS at different points: speed is compared as tokens/s, and speed-up is "
                 "tokens/s over the fastest AR-with-KV-cache row (hf-generate, ar, ar-cursor) at the same batch size.")
    notes.append("T/F: generated tokens per forward per sequence (the paper's measure); calls: model forward "
                 "calls of one repetition, prefill included.")
    return {
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k != "func"},
        "environment": {"torch": torch.__version__, "transformers": _tf_version(), "python": platform.python_version(),
                        "threads": torch.get_num_threads(), "device": args.device, "dtype": args.dtype, "cpu_count": os.cpu_count(),
                        "platform": platform.platform()},
        "n_prompts": len(items), "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in results],
        "samples": [{"method": r["method"], "tau": r["tau"], "batch_size": r["batch_size"], "output": r["_text0"]}
                    for r in results if r.get("status") == "ok" and r["batch_size"] == args.batch_sizes[0]],
        "notes": notes,
    }


def _tf_version() -> str:
    import transformers

    return transformers.__version__


def _compare(results: list[dict]) -> None:
    """Adds `speedup`, `baseline` and `same_as_ref` to the measured rows."""
    ok = [r for r in results if r.get("status") == "ok"]
    for bs in {r["batch_size"] for r in ok}:
        group = [r for r in ok if r["batch_size"] == bs]
        bases = [r for r in group if r["method"] in AR_BASELINES]
        base = max(bases, key=lambda r: r["tokens_per_second"]) if bases else None
        refs = {("ar", None): next((r for r in group if r["method"] == "hf-generate"), None)}
        for r in group:
            if r["method"] == "mars-nocache":
                refs[("mars", r["tau"])] = r
        for r in group:
            r["baseline"] = base["method"] if base else None
            r["speedup"] = r["tokens_per_second"] / base["tokens_per_second"] if base and base["tokens_per_second"] else None
            ref = refs.get(("ar", None) if r["model"] == "ar" else ("mars", r["tau"]))
            r["same_as_ref"] = (sum(a == b for a, b in zip(r["_ids"], ref["_ids"])) / len(ref["_ids"])
                                if ref is not None and ref["_ids"] else None)


def table(result: dict) -> str:
    lines = ["| batch | method | model | tau | tokens | wall s | tokens/s | T/F | calls | accuracy | = ref | speed-up |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    for r in result["runs"]:
        tau = "-" if r["tau"] is None else f"{r['tau']:g}"
        if r["status"] != "ok":
            lines.append(f"| {r['batch_size']} | {r['method']} | {r['model']} | {tau} | not available: "
                         f"{r['reason'].replace('|', '/')} | | | | | | | |")
            continue
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x" + (" (base)" if r["method"] == r["baseline"] else "")
        lines.append(f"| {r['batch_size']} | {r['method']} | {r['model']} | {tau} | {r['tokens']} | {r['seconds']:.2f} "
                     f"| {r['tokens_per_second']:.1f} | {r['tokens_per_forward']:.2f} | {r['model_calls']} "
                     f"| {pct(r['accuracy'])} | {pct(r['same_as_ref'])} | {sp} |")
    env = result["environment"]
    head = (f"{result['n_prompts']} prompts, max_new_tokens={result['settings']['max_new_tokens']}, "
            f"MARS block size {result['settings']['block_size']}, {result['settings']['repeats']} interleaved "
            f"repetitions (median), torch {env['torch']}, transformers {env['transformers']}, "
            f"{env['threads']} torch threads, device {env['device']}, {env.get('dtype', 'float32')}.")
    return head + "\n\n" + "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in result["notes"]) + "\n"


def figure(result: dict):
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s by batch size", "speed-up over AR with KV cache"))
    ok = [r for r in result["runs"] if r["status"] == "ok"]
    keys = []
    for r in ok:
        key = r["method"] if r["tau"] is None else f"{r['method']} τ={r['tau']:g}"
        if key not in keys:
            keys.append(key)
    for key in keys:
        rs = sorted((r for r in ok if (r["method"] if r["tau"] is None else f"{r['method']} τ={r['tau']:g}") == key),
                    key=lambda r: r["batch_size"])
        x = [r["batch_size"] for r in rs]
        fig.add_scatter(x=x, y=[r["tokens_per_second"] for r in rs], mode="lines+markers", name=key,
                        legendgroup=key, row=1, col=1)
        fig.add_scatter(x=x, y=[r["speedup"] for r in rs], mode="lines+markers", name=key, legendgroup=key,
                        showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="batch size", type="log")
    fig.update_yaxes(title_text="tokens / s", row=1, col=1)
    fig.update_yaxes(title_text="x over the fastest AR with KV cache", row=1, col=2)
    fig.update_layout(title=f"Decoding speed ({result['n_prompts']} prompts, "
                            f"max_new_tokens={result['settings']['max_new_tokens']})", height=500, width=1200)
    return fig


def write_outputs(result: dict, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"table": os.path.join(out_dir, "bench.md"), "json": os.path.join(out_dir, "bench.json"),
             "html": os.path.join(out_dir, "bench.html")}
    with open(paths["table"], "w", encoding="utf-8") as f:
        f.write("# Decoding benchmark\n\n" + table(result))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    figure(result).write_html(paths["html"], include_plotlyjs="cdn")
    return paths


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return vals


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one number")
    return vals


def _names(text: str) -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one method")
    return vals


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ar-model", default=DEFAULT_AR, help=f"AR baseline folder or hub id (default {DEFAULT_AR})")
    p.add_argument("--mars-model", default=DEFAULT_MARS, help=f"MARS model folder or hub id (default {DEFAULT_MARS})")
    p.add_argument("--prompts", help="JSONL of {\"prompt\": ..., \"answer\": optional} or chat records "
                                     "({\"messages\": [...], \"answer\": ...}); default: held-out synthetic problems")
    p.add_argument("--n", type=int, default=32, help="number of prompts (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic eval problems (default 0)")
    p.add_argument("--batch-sizes", type=_ints, default=(1, 4, 8, 16), help="comma-separated (default 1,4,8,16)")
    p.add_argument("--taus", type=_floats, default=(0.95,), help="comma-separated MARS thresholds (default 0.95)")
    p.add_argument("--metric", default="probability", choices=("probability", "entropy", "margin"))
    p.add_argument("--block-size", type=int, default=None,
                   help="MARS block size B (default: the MARS model's training block size, else 4)")
    p.add_argument("--cache-block-sizes", type=_ints, default=(4, 8, 16, 32, 64),
                   help="block-level cache sizes for mars-block (default 4,8,16,32,64)")
    p.add_argument("--methods", type=_names, default=list(FIXED_METHODS[:5]) + ["mars-nocache", "mars-sliding",
                                                                               "mars-block", "mars-cursor"],
                   help="comma-separated subset of: " + ", ".join(FIXED_METHODS) +
                        ", mars-block (all --cache-block-sizes), mars-block-<N> (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="generated tokens per prompt, at most (default 128)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per method, interleaved (default 3)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens (default 10)")
    p.add_argument("--threads", type=int, default=2, help="torch threads, fixed for the whole run (default 2)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="weights and compute dtype of both models (default float32, as the bundled models are saved)")
    p.add_argument("--output", default="bench", help="folder for bench.md, bench.json, bench.html (default ./bench)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    for name, minimum in (("n", 1), ("max_new_tokens", 1), ("repeats", 1), ("prompt_lookup_tokens", 1), ("threads", 1)):
        if getattr(a, name) < minimum:
            p.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(a, name)}")
    if a.block_size is None:
        a.block_size = _block_size_of(a.mars_model) or 4
    if a.block_size < 1:
        p.error(f"--block-size must be >= 1, got {a.block_size}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    try:
        method_list(a.methods, a.cache_block_sizes)
        from mars_core.config import check_tau

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
