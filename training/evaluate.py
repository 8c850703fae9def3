"""Evaluation: accuracy, tokens per forward and tokens/s of AR and MARS over a tau sweep.

    python -m training.evaluate --model runs/mars --ar-model runs/ar --n 500 --output runs/eval

writes `eval.json` and the speed-quality frontier (`frontier.html`, and `frontier.png` where
plotly's image export works) in the shape of the paper's Figure 3. Every run decodes the same
held-out problems with the same `max_new_tokens`, greedy unless told otherwise, one after the
other in one process after a warm-up. Tokens per forward are counted, not estimated.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from mars_core import DecodeConfig, generate, load_model
from mars_core.config import CACHES, METRICS
from mars_core.lists import list_arg
from tasks.synthetic import make_examples, score
from training.checkpoint import write_json

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_TAUS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5)


def run_one(model: PreTrainedModel, tok: PreTrainedTokenizerBase, examples: list[dict], cfg: DecodeConfig,
            batch_size: int, draft_model: PreTrainedModel | None = None) -> dict:
    """Decode every example's question; return accuracy (overall, per family) and speed.
    `draft_model`: the draft of mode="spec" (then draft acceptance and draft forwards too)."""
    prompts = [ex["messages"][0]["content"] for ex in examples]
    texts, ids, tokens, row_forwards, forwards, seconds = [], [], 0, 0, 0, 0.0
    drafted = accepted = draft_forwards = 0
    for i in range(0, len(prompts), batch_size):
        res = generate(model, tok, prompts[i:i + batch_size], cfg, draft_model=draft_model)
        texts += res.texts
        ids += res.token_ids
        tokens += res.stats.tokens
        row_forwards += res.stats.row_forwards
        forwards += res.stats.forwards
        seconds += res.stats.seconds
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted_drafts
        draft_forwards += res.stats.draft_forwards
    correct = [score(t, ex["answer"]) for t, ex in zip(texts, examples)]
    by_family = defaultdict(list)
    for ok, ex in zip(correct, examples):
        by_family[ex["family"]].append(ok)
    return {
        "mode": cfg.mode, "tau": cfg.tau, "block_size": cfg.effective_block_size,
        "metric": cfg.metric, "cache": cfg.cache,
        "accuracy": sum(correct) / len(correct),
        "accuracy_by_family": {f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        "tokens": tokens, "forwards": forwards, "row_forwards": row_forwards,
        "tokens_per_forward": tokens / max(row_forwards, 1),
        "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else 0.0,
        "draft_acceptance": accepted / drafted if drafted else None, "draft_forwards": draft_forwards,
        "_ids": ids, "_texts": texts,
    }


def sweep(model: PreTrainedModel, tok: PreTrainedTokenizerBase, examples: list[dict], taus: Sequence[float],
          block_sizes: Sequence[int], base: DecodeConfig, batch_size: int, label: str,
          before_run: Callable[[DecodeConfig], bool] | None = None) -> list[dict]:
    """AR, then MARS at each (block size, tau), on one model. Adds `matches_ar` per MARS run:
    the fraction of problems whose output equals this model's own AR output token for token.
    `before_run(config)` is called before every run; when it returns False the sweep ends there
    (a caller's progress bar and time limit)."""
    runs = []
    ar_cfg = replace(base, mode="ar")
    if before_run is not None and not before_run(ar_cfg):
        return runs
    ar = run_one(model, tok, examples, ar_cfg, batch_size)
    runs.append(dict(ar, model=label))
    for B in block_sizes:
        for tau in taus:
            cfg = replace(base, mode="mars", tau=tau, block_size=B)
            if before_run is not None and not before_run(cfg):
                return runs
            r = run_one(model, tok, examples, cfg, batch_size)
            r["matches_ar"] = sum(a == b for a, b in zip(r["_ids"], ar["_ids"])) / len(examples)
            runs.append(dict(r, model=label))
    return runs


def evaluate(models: dict[str, str], n: int = 500, seed: int = 0, taus: Sequence[float] = DEFAULT_TAUS,
             block_sizes: Sequence[int] = (4,),
             base: DecodeConfig | None = None, batch_size: int = 32, device: str = "cpu",
             samples: int = 3) -> dict:
    """`models` maps a label to a folder / hub id. The first AR-only entry may be the AR
    baseline: label it "ar-baseline" to skip its MARS sweep."""
    base = base or DecodeConfig(max_new_tokens=256, cache="sliding")
    examples = make_examples(n, seed, "eval")
    out = {"n": n, "seed": seed, "split": "eval", "base_config": asdict(base), "batch_size": batch_size,
           "torch_threads": torch.get_num_threads(), "runs": [], "samples": []}
    for label, path in models.items():
        model, tok = load_model(path, device=device)
        generate(model, tok, [examples[0]["messages"][0]["content"]], replace(base, max_new_tokens=8))  # warm-up
        only_ar = label == "ar-baseline"
        runs = sweep(model, tok, examples, taus, () if only_ar else block_sizes, base, batch_size, label)
        for r in runs:
            if r["mode"] == "mars" and r["tau"] in (1.0, 0.95) or r["mode"] == "ar":
                out["samples"] += [{"model": label, "mode": r["mode"], "tau": r["tau"],
                                    "question": ex["messages"][0]["content"], "output": t}
                                   for ex, t in zip(examples[:samples], r["_texts"][:samples])]
            out["runs"].append({k: v for k, v in r.items() if not k.startswith("_")})
    return out


def evaluate_draft(draft: str, same_size: str, target: str, recipe, base: DecodeConfig, batch_size: int = 32) -> dict:
    """A small draft model on its own (AR) and drafting `recipe.draft_tokens` tokens for the MARS
    `target` (mode="spec", exact: tau 1 and block 1), against the same-size AR model as the draft,
    then the paper's section 4.6 (the target's block at tau 0.95 after the accepted drafts)."""
    examples = make_examples(recipe.eval_n, recipe.seed, "eval")
    d_model, tok = load_model(draft)
    s_model, _ = load_model(same_size)
    t_model, _ = load_model(target)
    out = {"n": recipe.eval_n, "seed": recipe.seed, "batch_size": batch_size, "draft_tokens": recipe.draft_tokens,
           "num_parameters": sum(p.numel() for p in d_model.parameters()), "runs": []}
    spec = replace(base, mode="spec", cache="cursor", draft_tokens=recipe.draft_tokens, block_size=1, tau=1.0)
    plans = [("draft", "ar (the draft alone)", d_model, replace(base, mode="ar"), None),
             ("target", "ar (the target alone)", t_model, replace(base, mode="ar"), None),
             ("target", "spec, this draft", t_model, spec, d_model),
             ("target", "spec, the same-size AR model as draft", t_model, spec, s_model),
             ("target", "spec + MARS block tau 0.95, this draft", t_model,
              replace(spec, block_size=recipe.block_size, tau=0.95), d_model)]
    for model_label, label, model, cfg, dm in plans:
        r = run_one(model, tok, examples, cfg, batch_size, draft_model=dm)
        out["runs"].append(dict({k: v for k, v in r.items() if not k.startswith("_")}, model=model_label, run=label))
    return out


def frontier_figure(result: dict) -> go.Figure:
    """Accuracy and tokens/s against tokens per forward, one line per (model, block size)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Accuracy vs tokens per forward",
                                                        "Tokens/s vs tokens per forward"))
    groups = defaultdict(list)
    for r in result["runs"]:
        key = f"{r['model']} AR" if r["mode"] == "ar" else f"{r['model']} MARS B={r['block_size']}"
        groups[key].append(r)
    for key, runs in groups.items():
        runs.sort(key=lambda r: r["tokens_per_forward"])
        x = [r["tokens_per_forward"] for r in runs]
        text = ["AR" if r["mode"] == "ar" else f"τ={r['tau']}" for r in runs]
        mode = "markers+text" if len(runs) == 1 else "lines+markers+text"
        fig.add_scatter(x=x, y=[100 * r["accuracy"] for r in runs], text=text, textposition="top center",
                        mode=mode, name=key, legendgroup=key, row=1, col=1)
        # a precomputed sweep of a real model may carry no tokens/s (measured apart, side by side)
        fig.add_scatter(x=x, y=[r.get("tokens_per_second") for r in runs], text=text, textposition="top center",
                        mode=mode, name=key, legendgroup=key, showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="tokens per forward")
    fig.update_yaxes(title_text="exact-answer accuracy (%)", row=1, col=1)
    fig.update_yaxes(title_text="tokens / s", row=1, col=2)
    fig.update_layout(title=f"Speed-quality frontier ({result['n']} held-out problems)", height=450, width=1000)
    declutter_labels(fig)
    return fig


def declutter_labels(fig: go.Figure, dx: float = 0.12, dy: float = 0.12) -> None:
    """Drop a point's label where it would overlap one already placed in the same panel (within
    dx, dy of the panel's data ranges: about a "τ=0.95" label on a phone-wide panel, seen in
    Chromium at 390 px). Every point keeps its label on hover; the sweep's ends and the AR points
    come first, so they keep theirs. Labels may reach past the plot area (not cut at its top)."""
    panels = defaultdict(list)
    for tr in fig.data:
        panels[tr.xaxis or "x"].append(tr)
    for traces in panels.values():
        pts = [(x, y) for tr in traces for x, y in zip(tr.x, tr.y) if y is not None]
        if not pts:
            continue
        xr = (max(p[0] for p in pts) - min(p[0] for p in pts)) or 1.0
        yr = (max(p[1] for p in pts) - min(p[1] for p in pts)) or 1.0
        placed = []
        for tr in traces:
            n = len(tr.x)
            order = sorted(range(n), key=lambda i: (0 if i in (0, n - 1) else 1, i))
            text = list(tr.text)
            for i in order:
                if tr.y[i] is None:
                    continue
                x, y = tr.x[i] / xr, tr.y[i] / yr
                if any(abs(x - px) < dx and abs(y - py) < dy for px, py in placed):
                    text[i] = ""
                else:
                    placed.append((x, y))
            tr.update(hovertext=list(tr.text), hoverinfo="text+x+y", text=text, cliponaxis=False)


def write_outputs(result: dict, output_dir: str) -> dict:
    """eval.json and frontier.html (+ frontier.png when image export works) in output_dir."""
    os.makedirs(output_dir, exist_ok=True)
    write_json(os.path.join(output_dir, "eval.json"), result)
    return {"json": os.path.join(output_dir, "eval.json"), **write_frontier(result, output_dir)}


def write_frontier(result: dict, output_dir: str) -> dict:
    """frontier.html (+ frontier.png when image export works) in output_dir."""
    paths = {"html": os.path.join(output_dir, "frontier.html")}
    fig = frontier_figure(result)
    fig.write_html(paths["html"], include_plotlyjs="cdn")
    try:  # kaleido needs a Chrome; export is a bonus, the HTML is the figure
        fig.write_image(os.path.join(output_dir, "frontier.png"))
        paths["png"] = os.path.join(output_dir, "frontier.png")
    except Exception as e:  # noqa: BLE001 - any export failure just means no PNG
        paths["png_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return paths


def _per_second(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def summary_table(result: dict) -> str:
    """A markdown table of the runs."""
    lines = ["| model | mode | B | tau | accuracy | T/F | tokens/s | = AR |", "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        tau = "-" if r["mode"] == "ar" else f"{r['tau']}"
        same = f"{100 * r['matches_ar']:.0f}%" if "matches_ar" in r else "-"
        lines.append(f"| {r['model']} | {r['mode']} | {r['block_size']} | {tau} | {100 * r['accuracy']:.1f}% "
                     f"| {r['tokens_per_forward']:.2f} | {_per_second(r.get('tokens_per_second'))} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="MARS model folder or hub id (AR and MARS sweep)")
    p.add_argument("--ar-model", help="AR baseline folder or hub id (AR only), for comparison")
    p.add_argument("--n", type=int, default=500, help="held-out synthetic problems (default 500)")
    p.add_argument("--seed", type=int, default=0, help="seed of the eval split (default 0)")
    p.add_argument("--taus", type=list_arg(float), default=DEFAULT_TAUS, help="comma-separated tau sweep")
    p.add_argument("--block-sizes", type=list_arg(int, minimum=1), default=(4,), help="comma-separated MARS block sizes")
    p.add_argument("--metric", default="probability", choices=METRICS)
    p.add_argument("--cache", default="sliding", choices=CACHES)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32, help="prompts decoded together")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output", required=True, help="folder for eval.json and frontier.html/png")
    a = p.parse_args(argv)
    if a.n < 1:
        p.error("--n must be >= 1")
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        base = DecodeConfig(max_new_tokens=a.max_new_tokens, cache=a.cache, metric=a.metric)
        for t in a.taus:
            replace(base, tau=t)
        models = {"ar-baseline": a.ar_model} if a.ar_model else {}
        models["mars"] = a.model
        t0 = time.perf_counter()
        result = evaluate(models, a.n, a.seed, a.taus, a.block_sizes, base, a.batch_size, a.device)
        result["wall_seconds"] = time.perf_counter() - t0
        paths = write_outputs(result, a.output)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary_table(result))
    print("\n" + "\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
