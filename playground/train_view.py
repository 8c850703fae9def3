"""What the Train tab shows of a run: the progress bar with time left, the noisy and clean loss
curves, tokens per forward and accuracy at the evaluated steps, and the closing summary.
Pure functions of the run's events (`training.tiny_live`); every text is escaped."""
from __future__ import annotations

import html

import plotly.graph_objects as go

from .plots import message_figure


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class RunView:
    """The state of one run as the page draws it, fed event by event."""

    def __init__(self, total: int, budget_s: float, evals_planned: int):
        self.total, self.budget, self.evals_planned = total, budget_s, evals_planned
        self.step, self.elapsed, self.train_start = 0, 0.0, None
        self.curve: list[dict] = []
        self.evals: list[dict] = []
        self.phase = "starting"

    def add(self, event: dict) -> None:
        kind = event.get("type")
        if "elapsed" in event:
            self.elapsed = event["elapsed"]
        if kind == "start":
            self.total, self.phase = event["total"], "training"
        elif kind == "step":
            if self.train_start is None:
                self.train_start = (self.elapsed, event["step"] - 1)
            self.step = event["step"]
            self.curve.append({k: event.get(k) for k in ("step", "noisy", "clean")})
        elif kind == "eval":
            self.evals.append(event)

    def seconds_left(self) -> float | None:
        """From the pace of the steps so far and the evaluations still to come, within the budget."""
        if self.train_start is None or self.step <= self.train_start[1]:
            return None
        t0, s0 = self.train_start
        per_step = max(self.elapsed - t0 - sum(e["seconds"] for e in self.evals[1:]), 0.0) / (self.step - s0)
        eval_s = max((e["seconds"] for e in self.evals), default=0.0)
        left = (self.total - self.step) * per_step + max(self.evals_planned + 1 - len(self.evals), 0) * eval_s
        return min(left, max(self.budget - self.elapsed, 0.0))

    def progress_html(self, note: str = "") -> str:
        """The bar and its line: the step, time left and the latest losses, or `note` in their place."""
        pct = 100.0 * self.step / max(self.total, 1)
        if self.phase == "starting":
            words = "starting the training process and preparing the data…"
        else:
            left = self.seconds_left()
            words = f"step {self.step} of {self.total}"
            words += f" · about {_clock(left)} left" if left is not None else " · measuring the pace…"
            last = self.curve[-1] if self.curve else None
            if last is not None:
                words += f" · noisy loss {last['noisy']:.3f}"
                words += f" · clean loss {last['clean']:.3f}" if last["clean"] is not None else ""
        if note:
            words = note
        return (f'<div class="train-progress"><div class="tp-track" role="progressbar" aria-label="training progress" '
                f'aria-valuemin="0" aria-valuemax="{self.total}" aria-valuenow="{self.step}">'
                f'<span class="tp-bar" style="width: {pct:.1f}%"></span></div>'
                f'<div class="tp-text" id="train-progress-text">{html.escape(words)}</div></div>')

    def loss_figure(self) -> go.Figure:
        if not self.curve:
            return message_figure("The noisy and clean losses<br>appear here as the run trains.", height=280)
        steps = [p["step"] for p in self.curve]
        fig = go.Figure(go.Scatter(x=steps, y=[p["noisy"] for p in self.curve], name="noisy (the masks)",
                                   mode="lines", line=dict(color="hsl(212, 85%, 45%)")))
        clean = [p["clean"] for p in self.curve]
        if any(c is not None for c in clean):
            fig.add_trace(go.Scatter(x=steps, y=clean, name="clean (next token, the SFT term)", mode="lines",
                                     line=dict(color="hsl(28, 85%, 45%)")))
        else:
            fig.add_annotation(text="clean: the base's own, unchanged by construction (the gate)", x=0.99, y=0.97,
                               xref="paper", yref="paper", showarrow=False, xanchor="right")
        fig.update_layout(height=300, margin=dict(l=55, r=15, t=40, b=40), title="Training loss (cross-entropy)",
                          xaxis_title="step", legend=dict(orientation="h", x=0, y=-0.25), yaxis_type="log")
        return fig

    def eval_figure(self) -> go.Figure:
        if not self.evals:
            return message_figure("Tokens per forward and accuracy<br>appear here at the evaluated steps.", height=300)
        x = [e["step"] for e in self.evals]
        fig = go.Figure(go.Scatter(x=x, y=[e["tpf_095"] for e in self.evals], name="tokens per forward, tau 0.95",
                                   mode="lines+markers", line=dict(color="hsl(212, 85%, 45%)")))
        for key, name, colour in (("acc_095", "accuracy, tau 0.95", "hsl(212, 60%, 70%)"),
                                  ("acc_1", "accuracy, tau 1 (one token per forward)", "hsl(28, 85%, 45%)")):
            fig.add_trace(go.Scatter(x=x, y=[100 * e[key] for e in self.evals], name=name, yaxis="y2",
                                     mode="lines+markers", line=dict(color=colour, dash="dot")))
        fig.update_layout(height=320, margin=dict(l=55, r=55, t=40, b=40), xaxis_title="step",
                          title=f"On {self.evals[0]['n']} held-out problems",
                          yaxis=dict(title="tokens per forward", rangemode="tozero"),
                          yaxis2=dict(title="accuracy (%)", overlaying="y", side="right", range=[0, 105]),
                          legend=dict(orientation="h", x=0, y=-0.25))
        return fig

    def table_html(self) -> str:
        if not self.evals:
            return ""
        rows = "".join(f"<tr><td>{e['step']}</td><td>{e['tpf_095']:.2f}</td><td>{100 * e['acc_095']:.0f}%</td>"
                       f"<td>{100 * e['acc_1']:.0f}%</td></tr>" for e in self.evals)
        return ('<div class="table-scroll" tabindex="0" role="region" aria-label="evaluations"><table class="train-evals">'
                f'<caption>{self.evals[0]["n"]} held-out problems (not the Playground\'s examples). Step 0 is the AR '
                'model it starts from: its guesses at the untrained masks can be confident and wrong, so tokens per '
                'forward may start above 1 at low accuracy and first fall as the masks learn.</caption>'
                '<thead><tr><th scope="col">step</th><th scope="col">tokens per forward, tau 0.95</th>'
                '<th scope="col">accuracy, tau 0.95</th><th scope="col">accuracy, tau 1</th></tr></thead>'
                f'<tbody>{rows}</tbody></table></div>')


def summary_text(status: str, steps: int, seconds: float, evals: list[dict], sft: bool, objective: str) -> str:
    """The run's closing words: how it ended and what it changed, against the AR model (step 0)."""
    how = {"finished": "Finished", "stopped": "Stopped by you", "time budget": "Stopped at the time budget"}.get(
        status, status)
    text = f"{how} after {steps} steps in {_clock(seconds)}."
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        text += (f" Tokens per forward at tau 0.95: {last['tpf_095']:.2f} (accuracy {100 * last['acc_095']:.0f}%); "
                 f"accuracy at tau 1: {100 * last['acc_1']:.0f}% (the AR model it started from: "
                 f"{100 * first['acc_1']:.0f}%).")
        drop = first["acc_1"] - last["acc_1"]
        if objective == "paper" and not sft and drop > 0.05:
            text += (f" Without the SFT term the one-token accuracy fell by {100 * drop:.0f} points: the paper's "
                     "ablation (\"MARS w/o SFT loss\") reports this drop too; the clean loss is what keeps the AR path.")
        elif objective == "gated":
            text += " With the gate, tau 1 is the AR model itself: no accuracy can be lost there."
    return text + " Press \"Race it in the Playground\" to decode with it."
