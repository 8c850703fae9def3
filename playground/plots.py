"""Plotly figures of the playground: batch timeline, training mask, the
sliding-window steps of a generation and the speed-quality frontier."""
from __future__ import annotations

import plotly.graph_objects as go

from mars_core import mars_training_mask


def message_figure(text: str, height: int = 300) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=10, b=10))
    return fig


def timeline(accepted_per_step: list[list[int]], title: str) -> go.Figure:
    """Heatmap: samples (rows) x forwards (columns), tokens accepted; 0 = idle / finished."""
    if not accepted_per_step:
        return message_figure("no steps")
    n = len(accepted_per_step[0])
    z = [[step[i] for step in accepted_per_step] for i in range(n)]
    top = max(max(r) for r in z) or 1
    scale = [[0.0, "#eeeeee"], [0.5 / (top + 0.5), "#eeeeee"], [0.5 / (top + 0.5) + 1e-6, "hsl(212, 85%, 85%)"],
             [1.0, "hsl(212, 85%, 35%)"]]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(1, len(accepted_per_step) + 1)), y=[f"sample {i + 1}" for i in range(n)],
        colorscale=scale, zmin=-0.5, zmax=top, xgap=1, ygap=1,
        colorbar={"title": "accepted", "tickvals": list(range(0, top + 1))},
        hovertemplate="%{y}, forward %{x}: %{z} accepted<extra></extra>",
    ))
    fig.update_layout(title=title + " (grey = idle or finished)", height=120 + 28 * n,
                      xaxis_title="forward", margin=dict(l=80, r=20, t=50, b=40))
    fig.update_yaxes(autorange="reversed")
    return fig


def mask_figure(n: int, block_size: int) -> go.Figure:
    """The MARS training mask, straight from `mars_training_mask` ([noisy | clean] layout)."""
    m = mars_training_mask(n, block_size).int().tolist()
    labels = [f"noisy {i}" for i in range(n)] + [f"clean {i}" for i in range(n)]
    fig = go.Figure(go.Heatmap(
        z=m, x=labels, y=labels, colorscale=[[0, "#f4f4f4"], [1, "hsl(212, 85%, 45%)"]], zmin=0, zmax=1,
        showscale=False, xgap=1, ygap=1,
        hovertemplate="query %{y} → key %{x}: %{z}<extra>1 = may attend</extra>",
    ))
    fig.add_shape(type="line", x0=n - 0.5, x1=n - 0.5, y0=-0.5, y1=2 * n - 0.5, line=dict(color="#d22", width=2))
    fig.add_shape(type="line", y0=n - 0.5, y1=n - 0.5, x0=-0.5, x1=2 * n - 0.5, line=dict(color="#d22", width=2))
    fig.update_layout(title=f"MARS training attention mask, n = {n}, B = {block_size} (rows: queries, columns: keys)",
                      height=520, width=620, margin=dict(l=80, r=20, t=50, b=80))
    fig.update_yaxes(autorange="reversed")
    return fig


def window_figure(accepted: list[int], block: int, max_steps: int = 48) -> go.Figure:
    """The sliding window of a MARS generation: per forward, the committed prefix, the
    accepted predictions and the rejected mask slots (response positions only)."""
    if not accepted:
        return message_figure("Generate something in the Playground tab first.")
    steps = accepted[:max_steps]
    width = sum(steps) + block
    z, text = [], []
    pos = 0
    for a in steps:
        row = [1] * pos + [2] * a + [3] * max(block - a, 0)
        row = row + [0] * (width - len(row))
        z.append(row[:width])
        text.append([["", "committed", "accepted", "mask, rejected"][v] for v in row[:width]])
        pos += a
    fig = go.Figure(go.Heatmap(
        z=z, text=text, x=list(range(1, width + 1)), y=[f"forward {i + 1}" for i in range(len(steps))],
        colorscale=[[0, "#ffffff"], [0.33, "#ffffff"], [0.34, "#d9d9d9"], [0.66, "#d9d9d9"],
                    [0.67, "hsl(212, 85%, 55%)"], [0.83, "hsl(212, 85%, 55%)"], [0.84, "hsl(28, 85%, 80%)"],
                    [1, "hsl(28, 85%, 80%)"]],
        zmin=0, zmax=3, showscale=False, xgap=1, ygap=1,
        hovertemplate="%{y}, response position %{x}: %{text}<extra></extra>",
    ))
    more = f" (first {max_steps} of {len(accepted)})" if len(accepted) > max_steps else ""
    fig.update_layout(title=f"Sliding window, B = {block}: grey committed, blue accepted, orange rejected masks{more}",
                      height=140 + 16 * len(steps), xaxis_title="response position",
                      margin=dict(l=90, r=20, t=50, b=40))
    fig.update_yaxes(autorange="reversed")
    return fig


def frontier(result: dict | None):
    """The paper's Figure 3 shape, via training.evaluate.frontier_figure."""
    if not result or not result.get("runs"):
        return message_figure("No precomputed sweep: the model folder has no eval.json. Run a sweep below.")
    from training.evaluate import frontier_figure

    fig = frontier_figure(result)
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
    groups = list(dict.fromkeys(tr.legendgroup for tr in fig.data))
    for tr in fig.data:  # one colour per line in both panels
        colour = palette[groups.index(tr.legendgroup) % len(palette)]
        tr.update(marker_color=colour, line_color=colour)
    # stacked, legend below: readable from a 390 px phone to a desktop (side by side, the
    # titles and axes of the two panels overlap on a phone)
    fig.update_layout(width=None, autosize=True, height=760, title=dict(font=dict(size=15), x=0.02),
                      xaxis=dict(domain=[0, 1], anchor="y"), yaxis=dict(domain=[0.6, 0.93]),
                      xaxis2=dict(domain=[0, 1], anchor="y2"), yaxis2=dict(domain=[0.0, 0.4]),
                      legend=dict(orientation="h", x=0, y=-0.12, yanchor="top"),
                      margin=dict(l=60, r=20, t=60, b=40))
    for ann, y in zip(fig.layout.annotations, (0.95, 0.42)):  # the two panel titles
        ann.update(x=0.0, xanchor="left", y=y, yanchor="bottom", font=dict(size=13))
    return fig
