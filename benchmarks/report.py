"""The benchmark's report: the markdown table, the plotly figure, and the files they go to."""
from __future__ import annotations

import json
import os


def table(result: dict) -> str:
    """bench.md's body: a settings line, one table row per run, the notes."""
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
            f"{env['threads']} torch threads, device {env['device']}, {env.get('dtype', 'float32')}"
            f"{', linear layers prepacked for oneDNN (--prepack)' if env.get('prepack') else ''}.")
    notes = list(result["notes"])
    graphs = [f"{r['method']}{'' if r['tau'] is None else ' tau ' + format(r['tau'], 'g')} at batch {r['batch_size']}: "
              f"{r['graphs_warmup']} in warm-up, {r['graphs_timed']} while timed"
              for r in result["runs"] if r["status"] == "ok" and (r.get("graphs_warmup") or r.get("graphs_timed"))]
    if graphs:
        notes.append("Graphs torch.compile built per row (a batch size reuses the graphs an earlier row built for "
                     "the batch sizes it shrinks to; a MARS row shares the graphs of its tau with the other taus): "
                     + "; ".join(graphs) + ".")
    spread = unsteady(result["runs"])
    if spread:
        notes.append("Repetitions that disagree by more than " + f"{SPREAD:.0%}" + " (slowest over fastest): " + "; ".join(spread)
                     + ". Something else ran, or the row was not warm; a median of 3 or more sets one such repetition "
                     "aside, a median of 2 cannot: rerun before quoting it.")
    return head + "\n\n" + "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


SPREAD = 0.15  # repetitions of one row on a quiet machine agreed within 6-8% in the runs of 2026-12-06


def unsteady(runs: list[dict]) -> list[str]:
    """The rows whose timed repetitions differ by more than `SPREAD`, with their seconds."""
    out = []
    for r in runs:
        secs = r.get("seconds_all") or []
        if r.get("status") == "ok" and len(secs) > 1 and min(secs) > 0 and max(secs) / min(secs) - 1 > SPREAD:
            tau = "" if r["tau"] is None else f" tau {r['tau']:g}"
            out.append(f"{r['method']}{tau} at batch {r['batch_size']}: " + ", ".join(f"{x:.2f}" for x in secs) + " s")
    return out


def figure(result: dict):
    """Tokens/s and speed-up against batch size, one line per method (and tau)."""
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
    """Write bench.md, bench.json and bench.html into `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"table": os.path.join(out_dir, "bench.md"), "json": os.path.join(out_dir, "bench.json"),
             "html": os.path.join(out_dir, "bench.html")}
    with open(paths["table"], "w", encoding="utf-8") as f:
        f.write("# Decoding benchmark\n\n" + table(result))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    figure(result).write_html(paths["html"], include_plotlyjs="cdn")
    return paths
