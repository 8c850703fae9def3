"""Table and plotly figures of a load simulation (`benchmarks.load`)."""
from __future__ import annotations

import json
import math
import os

COLORS = {"fixed 1": "hsl(28, 85%, 45%)", "fixed 0.95": "hsl(140, 55%, 35%)", "fixed 0.7": "hsl(0, 70%, 45%)",
          "adaptive": "hsl(212, 85%, 45%)"}
DASH = {1: "dot"}  # one slot: one request at a time


def run_label(r: dict, result: dict) -> str:
    many = len(result["settings"]["slots"]) > 1
    return f"{r['policy']} ({r['slots']} slot{'s' * (r['slots'] > 1)})" if many else r["policy"]


def _color(r: dict) -> str:
    return COLORS.get(r["policy"], "hsl(270, 50%, 45%)")


def table(result: dict) -> str:
    s = result["settings"]
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    p = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    names = [ph["name"] for ph in result["phases"]]
    phase_cols = list(dict.fromkeys(names)) if len(set(names)) > 1 else []
    head = ["policy", "slots", "p50 TTFT s", "p95 TTFT s", "p50 latency s", "p95 latency s",
            f"p95 <= {s['target']:g} s", "tokens/s", "T/F", "mean tau", "accuracy"]
    head += [f"accuracy ({n})" for n in phase_cols] + ["requests", "unfinished"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["results"]:
        row = [r["policy"], str(r["slots"]), f(r["p50_ttft"]), f(r["p95_ttft"]), f(r["p50_latency"]),
               f(r["p95_latency"]), "yes" if r["meets_target"] else "**no**", f(r["tokens_per_second"], 0),
               f(r["tokens_per_forward"]), f(r["mean_tau"], 3), p(r["accuracy"])]
        row += [p(r["by_phase"].get(n, {}).get("accuracy")) for n in phase_cols]
        row += [str(r["requests"]), str(r["unfinished"])]
        lines.append("| " + " | ".join(row) + " |")
    rates = ", ".join(f"{ph['name']} {ph['start']:.0f}-{ph['end']:.0f} s at {ph['rate']:g}/s" for ph in result["phases"])
    reps = s["repeats"]
    intro = (f"Pattern {s['pattern']} ({rates}); {result['results'][0]['requests']} held-out requests, "
             f"max_new_tokens {s['max_new_tokens']}, block size {s['block_size']}, clock {s['clock']}, "
             f"{reps} repetition{'s' * (reps > 1)} (median{'; noise below' if reps > 1 else ''}). "
             f"Latency: arrival to last token; TTFT: arrival to first token. Target: p95 latency <= {s['target']:g} s.")
    noise = []
    if reps > 1:
        for r in result["results"]:
            vals = [x["p95_latency"] for x in r["repeats"] if x["p95_latency"] is not None]
            tps = [x["tokens_per_second"] for x in r["repeats"]]
            if vals:
                noise.append(f"- {r['policy']} ({r['slots']} slots): p95 latency {min(vals):.2f}-{max(vals):.2f} s, "
                             f"tokens/s {min(tps):.0f}-{max(tps):.0f} over {len(vals)} repetitions")
    return intro + "\n\n" + "\n".join(lines) + ("\n\n" + "\n".join(noise) if noise else "") + "\n"


def timeline_figure(result: dict, height: int = 720):
    """Latency per request (by arrival), queue and tau against time, every run on one time axis."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("latency of each request", "requests waiting + running", "tau"))
    for r in result["results"]:
        name, color = run_label(r, result), _color(r)
        dash = DASH.get(r["slots"], "solid")
        reqs = [q for q in r["per_request"] if q["latency"] is not None]
        fig.add_scatter(x=[q["arrival"] for q in reqs], y=[q["latency"] for q in reqs], mode="markers", name=name,
                        legendgroup=name, marker=dict(color=color, size=5, symbol="circle-open" if r["slots"] == 1
                                                      else "circle"), row=1, col=1)
        steps = r["steps"]
        fig.add_scatter(x=[x["t"] for x in steps], y=[x["waiting"] + x["running"] for x in steps], mode="lines",
                        name=name, legendgroup=name, showlegend=False, line=dict(color=color, dash=dash), row=2, col=1)
        fig.add_scatter(x=[x["t"] for x in steps], y=[x["tau"] for x in steps], mode="lines", name=name,
                        legendgroup=name, showlegend=False, line=dict(color=color, dash=dash, shape="hv"), row=3, col=1)
    target = result["settings"]["target"]
    fig.add_hline(y=target, line=dict(color="black", dash="dash", width=1), row=1, col=1,
                  annotation_text=f"target {target:g} s", annotation_position="top left")
    for ph in result["phases"]:
        if ph["name"] == "burst":
            for row in (1, 2, 3):
                fig.add_vrect(x0=ph["start"], x1=ph["end"], fillcolor="hsl(28, 85%, 60%)", opacity=0.12,
                              line_width=0, row=row, col=1)
    fig.update_yaxes(title_text="seconds", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="tau", row=3, col=1)
    fig.update_xaxes(title_text="time (s, the simulation clock)", row=3, col=1)
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=40, b=50),
                      legend=dict(orientation="h", y=-0.12, x=0))
    return fig


def front_figure(result: dict, height: int = 420):
    """Accuracy against p95 latency, one point per run: the latency-quality front."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in result["results"]:
        if r["p95_latency"] is None or r["accuracy"] is None:
            continue
        fig.add_scatter(x=[r["p95_latency"]], y=[100 * r["accuracy"]], mode="markers+text", name=run_label(r, result),
                        cliponaxis=False,
                        text=[run_label(r, result)], textposition="top center",
                        marker=dict(size=12, color=_color(r), symbol="circle-open" if r["slots"] == 1 else "circle"))
    target = result["settings"]["target"]
    fig.add_vline(x=target, line=dict(color="black", dash="dash", width=1))
    fig.add_annotation(x=math.log10(target), y=1, yref="paper", text=f"target {target:g} s", showarrow=False,
                       xanchor="left", yanchor="top")  # on a log axis an annotation's x is log10
    fig.update_xaxes(title_text="p95 latency (s)", type="log")
    fig.update_yaxes(title_text="accuracy (%)")
    fig.update_layout(height=height, showlegend=False, margin=dict(l=60, r=20, t=30, b=50),
                      title=dict(text="latency-quality front (up and left is better)", font=dict(size=14)))
    return fig


def write_outputs(result: dict, out_dir: str, png: bool = False) -> dict:
    """load.md, load.json and the two figures as HTML; with `png`, also as PNG (kaleido drives a
    Chrome/Chromium; if that fails the PNGs are skipped with a note in the returned paths)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"table": os.path.join(out_dir, "load.md"), "json": os.path.join(out_dir, "load.json"),
             "timeline": os.path.join(out_dir, "load_timeline.html"), "front": os.path.join(out_dir, "load_front.html")}
    with open(paths["table"], "w", encoding="utf-8") as f:
        f.write("# Serving under load\n\n" + table(result))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, separators=(",", ":"))  # compact: thousands of steps
    timeline_figure(result).write_html(paths["timeline"], include_plotlyjs="cdn")
    front_figure(result).write_html(paths["front"], include_plotlyjs="cdn")
    if png:
        try:
            for name, fig, h in (("timeline", timeline_figure(result), 760), ("front", front_figure(result), 420)):
                paths[f"{name}_png"] = os.path.join(out_dir, f"load_{name}.png")
                fig.write_image(paths[f"{name}_png"], width=1200, height=h)
        except Exception as e:  # noqa: BLE001 - no browser for kaleido: the HTML figures are enough
            paths["png"] = f"not written ({type(e).__name__}: {str(e)[:120]})"
    return paths
