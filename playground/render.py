"""HTML for the playground: tokens coloured by the forward pass that produced them, counters,
the legend, the live accepted-tokens-per-step chart and the AR/MARS agreement line.

Pure functions of what `mars_core.stream` reported; no decoding happens here.
"""
from __future__ import annotations

import colorsys
import html

from .exactness import agree_label as exactness_label

HUES = (212, 28)  # alternating per step: blue, orange
REPLACEMENT = "\ufffd"


def _luminance(rgb: tuple[float, float, float]) -> float:
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: float, b: float) -> float:
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


DARK, LIGHT = (0.067, 0.067, 0.067), (1.0, 1.0, 1.0)  # #111, #fff


def step_colour(step: int, n: int, block: int) -> tuple[str, str]:
    """(background, text colour) for a step that accepted `n` of `block` predictions: the hue
    alternates with the step, the colour deepens with the number of tokens accepted. The text is
    dark or white, whichever reads better; a shade where neither reaches WCAG AA's 4.5:1 is
    darkened until white does."""
    hue = HUES[step % 2]
    frac = 0.0 if block <= 1 else min(max(n - 1, 0) / (block - 1), 1.0)
    light = round(88 - 48 * frac)
    while True:
        bg = _luminance(colorsys.hls_to_rgb(hue / 360, light / 100, 0.85))
        dark, white = _contrast(bg, _luminance(DARK)), _contrast(bg, 1.0)
        if max(dark, white) >= 4.6 or light <= 20:  # a little above 4.5: browsers round to 8-bit
            break
        light -= 2
    return f"hsl({hue}, 85%, {light}%)", "#111" if dark >= white else "#fff"


class TokenTrack:
    """The text of one generation, step by step, as coloured spans.

    Byte-level tokenizers can split one character over several tokens, so each step's text is
    the difference between the decoded text of all ids so far and of the ids before it, with
    an unfinished character (U+FFFD at the end) held back until a later step completes it.
    """

    def __init__(self, tokenizer, block: int):
        self.tok = tokenizer
        self.block = block
        self.ids: list[int] = []
        self.spans: list[str] = []
        self.accepted: list[int] = []  # per step
        self.taus: list[float] = []  # per step
        self._stable = ""

    def add(self, step: int, ids: list[int], confs: list[float], tau: float, verified: int = 0) -> None:
        """One forward's tokens; the first `verified` of them are drafts the forward verified
        (exact modes), shown apart from the rest (underlined, and said so on hover)."""
        self.ids.extend(ids)
        n = len(ids)
        self.accepted.append(n)
        self.taus.append(float(tau))
        if not ids:
            self._piece(len(self.ids))
            return
        bg, fg = step_colour(step, n, self.block)
        parts = [(ids[:verified], confs[:verified], True), (ids[verified:], confs[verified:], False)]
        done = len(self.ids) - n
        for part, pconf, is_draft in parts:
            if not part:
                continue
            done += len(part)
            piece = self._piece(done)
            conf = ", ".join(f"{c:.2f}" for c in pconf)
            what = (f"{len(part)} verified draft{'s' if len(part) != 1 else ''} (exact: the model's own AR tokens)"
                    if is_draft else f"{n} token{'s' if n != 1 else ''}" if not verified else
                    f"{len(part)} more token{'s' if len(part) != 1 else ''} after the verified drafts")
            title = f"forward {step + 1}: {what}, confidence {conf}, tau {tau:g}"
            cls = "tok verified" if is_draft else "tok"
            self.spans.append(  # title on hover; tabindex + data-tip: the same details on tap / focus
                f'<span class="{cls}" tabindex="0" data-step="{step}" data-n="{n}" title="{html.escape(title)}" '
                f'data-tip="{html.escape(title)}" style="background:{bg};color:{fg}">{html.escape(piece) or "&#8203;"}</span>'
            )

    def _piece(self, upto: int) -> str:
        """The text the ids up to `upto` add to what was shown before (byte-level safe)."""
        text = self.tok.decode(self.ids[:upto], skip_special_tokens=True)
        stable = text.rstrip(REPLACEMENT)
        if stable.startswith(self._stable):
            piece = stable[len(self._stable):]
        else:  # a merge rewrote earlier text (rare): show the whole new suffix
            common = 0
            for a, b in zip(stable, self._stable):
                if a != b:
                    break
                common += 1
            piece = stable[common:]
        self._stable = stable
        return piece

    @property
    def text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=True)


def legend_html(block: int, exact: bool = False, beyond: bool = False) -> str:
    """The colour key; `beyond`: some forward accepted more than `block` tokens (prompt-lookup
    drafts), which share the deepest shade, so its label reads "B+"."""
    cells = []
    for n in range(1, block + 1):
        chips = "".join(
            f'<span class="chip" style="background:{step_colour(s, n, block)[0]}"></span>' for s in (0, 1)
        )
        cells.append(f'<span class="leg">{chips}{n}{"+" if beyond and n == block else ""}</span>')
    return ('<div class="legend">Colour = the forward pass that produced the token (hues alternate); '
            f'depth = tokens accepted in it: {"".join(cells)}. '
            + ('<span class="tok verified legend-verified">Underlined</span> = a verified draft (the model checked '
               'it: exactly its own AR token). ' if exact else '')
            + 'Hover or tap a token for its forward and confidence.</div>')


def counters(forwards: int, tokens: int, seconds: float, elapsed: float = 0.0) -> dict:
    """The one source of a side's figures: the panel and the speed gauge both render these.
    tokens/s is over compute time (`seconds`, the side's own forwards, slow motion excluded);
    `elapsed` is wall time since Generate, slow motion and the other side included."""
    return {
        "forwards": forwards,
        "tokens": tokens,
        "tokens_per_forward": tokens / forwards if forwards else 0.0,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
        "elapsed": elapsed,
    }


STATUS_TEXT = {"idle": "idle", "waiting": "waiting", "queued": "queued", "running": "running",
               "done": "done: end of the answer", "limit": "stopped at the token limit",
               "stopped": "stopped", "cancelled": "cancelled", "error": "error"}


def panel_html(side: str, title: str, model_name: str, track: TokenTrack | None, stats: dict | None,
               status: str, note: str = "", placeholder: str = "(press Generate)") -> str:
    """One side of the playground. `data-status` is one of STATUS_TEXT's keys."""
    s = stats or counters(0, 0, 0.0)
    body = "".join(track.spans) if track is not None else f'<span class="muted">{html.escape(placeholder)}</span>'
    block = track.block if track is not None else 1
    exact = track is not None and any('class="tok verified"' in sp for sp in track.spans)
    beyond = track is not None and max(track.accepted, default=0) > block
    cnt = (f'<span class="cnt" data-k="forwards">forwards <b>{s["forwards"]}</b></span>'
           f'<span class="cnt" data-k="tokens">tokens <b>{s["tokens"]}</b></span>'
           f'<span class="cnt" data-k="tpf">tokens/forward <b>{s["tokens_per_forward"]:.2f}</b></span>'
           f'<span class="cnt" data-k="tps">tokens/s <b>{s["tokens_per_second"]:.1f}</b></span>'
           f'<span class="cnt" data-k="compute">compute <b>{s["seconds"]:.2f} s</b></span>'
           f'<span class="cnt" data-k="elapsed">elapsed <b>{s["elapsed"]:.2f} s</b></span>')
    note_html = f'<div class="note">{html.escape(note)}</div>' if note else ""
    return (f'<div class="mars-panel" data-side="{side}" data-status="{status}">'
            f'<div class="head"><b>{html.escape(title)}</b> <span class="model">{html.escape(model_name)}</span>'
            f' <span class="status">{STATUS_TEXT.get(status, status)}</span></div>'
            f'<div class="counters">{cnt}</div>{note_html}'
            f'<div class="text">{body}</div>{legend_html(block, exact, beyond)}</div>')


def speed_html(ar: dict | None, mars: dict | None) -> str:
    """MARS and AR tokens/s as two bars and their ratio: the same dicts the panels show."""
    ar, mars = ar or counters(0, 0, 0.0), mars or counters(0, 0, 0.0)
    a, m = ar["tokens_per_second"], mars["tokens_per_second"]
    top = max(a, m, 1e-9)
    ratio = f"<b>{m / a:.2f}x</b>" if a > 0 and m > 0 else "–"

    def bar(label, v, cls):
        return (f'<div class="sp-row"><span class="sp-lbl">{label}</span><span class="sp-track">'
                f'<span class="sp-bar {cls}" style="width:{100 * v / top:.1f}%"></span></span>'
                f'<span class="sp-val" data-k="{cls}-tps">{v:.1f} tok/s</span></div>')

    ea = ar["tokens"] / ar["elapsed"] if ar["elapsed"] > 0 else 0.0  # the race: tokens per elapsed second
    em = mars["tokens"] / mars["elapsed"] if mars["elapsed"] > 0 else 0.0
    race = f"<b>{em / ea:.2f}x</b>" if ea > 0 and em > 0 else "–"
    return (f'<div class="speed" data-ar="{a:.3f}" data-mars="{m:.3f}">'
            f'<div class="sp-title">Speed-up of MARS over AR: <span data-k="speedup">{ratio}</span> '
            '<span class="muted">(tokens per second of compute time, as in the panels; slow motion '
            f'excluded)</span> · in elapsed time: <span data-k="race">{race}</span> <span class="muted">(tokens '
            'per second since Generate, the race you watch: slow motion and both sides included)</span></div>'
            + bar("MARS", m, "mars") + bar("AR", a, "ar") + '</div>')


def steps_chart_html(accepted: list[int], taus: list[float], block: int, tau_max: float = 1.0) -> str:
    """A small SVG bar chart: tokens accepted by each MARS forward, with tau as a line."""
    if not accepted:
        return '<div class="steps-chart muted">accepted tokens per step appear here while MARS runs</div>'
    n = len(accepted)
    w, h, pad, top_pad, right = 600, 130, 18, 10, 30  # right: room for tau's own axis
    span = h - pad - top_pad
    bw = (w - pad - right) / n
    top = max(block, *accepted)  # prompt lookup may verify more tokens than a block in one forward
    bars = []
    for i, a in enumerate(accepted):
        bh = span * a / top
        bg, _ = step_colour(i, a, block)
        bars.append(f'<rect class="bar" data-n="{a}" x="{pad + i * bw:.2f}" y="{h - pad - bh:.2f}" '
                    f'width="{max(bw - 0.5, 0.5):.2f}" height="{bh:.2f}" fill="{bg}" stroke="#555" stroke-width="0.3">'
                    f'<title>step {i + 1}: {a} accepted, tau {taus[i]:g}</title></rect>')
    pts = " ".join(f"{pad + (i + 0.5) * bw:.2f},{h - pad - span * min(t / tau_max, 1.0):.2f}"
                   for i, t in enumerate(taus))
    ticks = sorted({0, top // 2, top}) if top > 4 else range(0, top + 1)  # no overlapping labels at B = 16
    axis = "".join(f'<text x="2" y="{h - pad - span * k / top + 3:.1f}" font-size="10">{k}</text>' for k in ticks)
    # tau has its own scale: its axis on the right, in the line's colour
    tau_axis = "".join(f'<text class="tau-tick" x="{w - 2}" y="{h - pad - span * f + 3:.1f}" font-size="10" '
                       f'text-anchor="end" fill="#b00">{f * tau_max:g}</text>' for f in (0, 0.5, 1))
    return (f'<div class="steps-chart"><div class="muted">MARS: tokens accepted per forward (bars, left axis 0-{top}) '
            f'and tau (red line, right axis 0-{tau_max:g}) over the generation</div>'
            f'<svg viewBox="0 0 {w} {h}" width="100%" height="{h}" preserveAspectRatio="none">{axis}{tau_axis}'
            f'{"".join(bars)}<polyline points="{pts}" fill="none" stroke="#d22" stroke-width="1.5"/>'
            f'<text x="{pad}" y="{h - 4}" font-size="9">step 1</text>'
            f'<text x="{w - right - 40}" y="{h - 4}" font-size="9">step {n}</text></svg></div>')


def first_difference(a: str, b: str) -> int | None:
    """Index of the first differing character, None when equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_html(ar_text: str, mars_text: str, ar_ids: list[int] | None = None,
                 mars_ids: list[int] | None = None, guaranteed: bool = False, why_not: str = "",
                 reduced: str = "") -> str:
    """Whether the two outputs agree and, if not, where they first differ. `guaranteed`: the MARS
    side's mode proves the agreement (lossless decoding of the same model, greedy). `why_not`: an
    exact mode whose guarantee does not cover this comparison says why, agree or not. `reduced`: the
    precision (e.g. "bfloat16") in which an exact mode promises only the model's argmax per verifying
    forward (playground.exactness): its agreement line says so instead of "guaranteed"."""
    i = first_difference(ar_text, mars_text)
    note = f'<br><span class="muted">{html.escape(why_not)}</span>' if why_not else ""
    if i is None and guaranteed:
        return ('<div class="compare" data-agree="1" data-guaranteed="1">✓ identical to AR (guaranteed: every '
                'MARS token is a verified draft or the model\'s own AR token).</div>')
    if i is None and reduced:
        return (f'<div class="compare" data-agree="1" data-guaranteed="{html.escape(reduced)}">'
                f'{html.escape(exactness_label(reduced))}</div>')
    if i is None:
        return f'<div class="compare" data-agree="1">✓ AR and MARS outputs are identical.{note}</div>'
    tok = ""
    if ar_ids is not None and mars_ids is not None:
        j = next((k for k, (x, y) in enumerate(zip(ar_ids, mars_ids)) if x != y), min(len(ar_ids), len(mars_ids)))
        tok = f" (token {j + 1})"
    ctx = lambda t: html.escape(t[max(0, i - 20):i]) + "<mark>" + html.escape(t[i:i + 20] or "(end)") + "</mark>"
    return (f'<div class="compare" data-agree="0">≠ The outputs first differ at character {i + 1}{tok}:'
            f'<br>AR: …{ctx(ar_text)}<br>MARS: …{ctx(mars_text)}{note}</div>')
