"""The "exact, fastest here" mode: `mars_core.fastest_exact`'s configuration for each MARS model the
playground serves, measured once per model in a background thread and kept.

`fastest_exact` measures what a forward of each width costs on this machine (kept on disk under
the cache root, so a restart does not measure again) and replays candidate draft shapes on the
model's own AR output of a few sample prompts: tens of seconds for the real pair on a 2-core CPU,
about a second for the tiny one. Until a model's configuration is ready the mode runs lossless
MARS + prompt lookup (also exact) and the page says so.

Eager, not compiled (`compile=False`): a compiled decoder compiles one graph per window width
it meets, tens of seconds each on this CPU, and would do so while a visitor watches, on every
fresh server and for every model a session loads; its graphs are also held per process and
shape, for every visitor's model. The playground streams one forward at a time, so it would
also pay a graph break per step. The costs `fastest_exact` weighs are the eager forwards' too,
so the configuration it picks is the fastest for the decoder the page runs.
"""
from __future__ import annotations

import html
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from mars_core import DecodeConfig

from .models import Loaded, guards_repeats, scrub

MAX_NEW = 96  # fastest_exact's replay length: its default, what the library's measurements use
FALLBACK = "lossless MARS + prompt lookup"  # what the mode runs until the measurement is ready


@dataclass
class Entry:
    """One model's measurement: measuring, ready or failed."""

    state: str = "measuring"
    config: DecodeConfig | None = None
    report: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    seconds: float | None = None
    error: str = ""

    @property
    def chosen(self) -> dict | None:
        """The report's line for the chosen configuration (its tokens per forward, modelled speed-up)."""
        cands = self.report.get("candidates") or []
        return max(cands, key=lambda c: c["speedup"]) if cands else None


def config_name(cfg: DecodeConfig) -> str:
    if cfg.mode == "ar":
        return "AR itself: no draft shape is modelled faster than AR on this machine"
    if cfg.draft_budget is not None:
        return f"{cfg.draft_budget[0]} draft nodes, {cfg.draft_budget[1]} mask groups per forward"
    if cfg.draft_tree is not None:
        return f"draft tree {cfg.draft_tree}"
    return f"chain, mask groups after {cfg.draft_groups}"


class FastestConfigs:
    """`fastest_exact` per model (by source and quantization: the same weights), at most `capacity`
    kept (a few numbers each; the least recently asked dropped)."""

    def __init__(self, measure=None, capacity: int = 64):
        if measure is None:
            from mars_core import fastest_exact as measure
        self.measure = measure
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], Entry] = OrderedDict()

    @staticmethod
    def key(loaded: Loaded) -> tuple[str, str]:
        return loaded.source, loaded.quantization

    def get(self, loaded: Loaded) -> Entry | None:
        with self._lock:
            return self._items.get(self.key(loaded))

    def start(self, loaded: Loaded, prompts: list[str] | None = None, block_size: int | None = None) -> Entry:
        """The model's entry, its measurement started in the background if it has none yet."""
        with self._lock:
            key = self.key(loaded)
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            entry = self._items[key] = Entry()
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        threading.Thread(target=self._run, args=(entry, loaded, prompts, block_size), name="fastest-exact",
                         daemon=True).start()
        return entry

    def _run(self, entry: Entry, loaded: Loaded, prompts, block_size) -> None:
        try:
            report: dict = {}
            cfg = self.measure(loaded.model, loaded.tokenizer, prompts=prompts, block_size=block_size,
                               max_new_tokens=MAX_NEW, compile=False, report=report)
            entry.report, entry.config = report, cfg
            entry.state = "ready"
        except Exception as e:  # noqa: BLE001 - the mode falls back; the page says why in one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            entry.error, entry.state = scrub(first, [loaded.source])[:200], "failed"
        entry.seconds = time.perf_counter() - entry.started

    def fallback_note(self, entry: Entry | None) -> str:
        """What a run of the mode says while it runs the fallback (empty once the config is ready)."""
        if entry is not None and entry.state == "ready":
            return ""
        if entry is not None and entry.state == "failed":
            return f"the fastest configuration could not be measured ({entry.error}): this run used {FALLBACK}, also exact"
        return (f"the fastest exact configuration for this model is still being measured on this machine: this run "
                f"used {FALLBACK}, also exact")

    def summary(self, entry: Entry | None) -> str:
        """The mode's half of the page's line: what it gives on this model (plain text)."""
        if entry is None or entry.state == "measuring":
            waited = f" ({time.perf_counter() - entry.started:.0f} s so far)" if entry is not None else ""
            return (f"exact, fastest here: being measured on this machine{waited}; until then it runs {FALLBACK}, "
                    "also exact")
        if entry.state == "failed":
            return f"exact, fastest here: not measured ({entry.error}); it runs {FALLBACK}, also exact"
        best = entry.chosen
        # tokens per forward only: the modelled speed-up rests on a cost curve measured once, while the server
        # may have been busy; the race on the page shows the speed measured now
        figures = f"{best['tokens_per_forward']:.2f} tokens per forward on sample prompts" if best else "measured"
        return f"exact, fastest here: {figures} ({config_name(entry.config)}); output = the model's own AR output"


def tau_summary(loaded: Loaded, block_size: int, tau: float = 0.95) -> str:
    """MARS at tau on this model, from its card's sweep (`eval.json`), or that there is none."""
    data = loaded.eval_json() or {}
    runs = data.get("runs") or []
    at = [r for r in runs
          if r.get("mode") == "mars" and r.get("tau") == tau and r.get("block_size") in (block_size, None)]
    guard = guards_repeats(loaded)  # the row of what the page's tau mode runs
    at = next((r for r in at if r.get("repeat_guard", False) == guard), at[0] if at else None)
    one = next((r for r in runs if r.get("mode") == "mars" and r.get("tau") == 1.0), None)  # = its AR
    if at is None:
        return f"MARS at tau: this model's folder has no recorded sweep at tau {tau:g}"
    with_guard = " with the repeat guard" if at.get("repeat_guard") else ""
    line = f"MARS at tau {tau:g}{with_guard}: {at['tokens_per_forward']:.2f} tokens per forward"
    if at.get("accuracy") is not None and one is not None and one.get("accuracy") is not None:
        line += f", {100 * at['accuracy']:.1f}% right against {100 * one['accuracy']:.1f}% at tau 1"
    where = data.get("source") or "the model card's sweep"
    return f"{line} ({where})"


def mode_line_html(fastest: FastestConfigs, loaded: Loaded, block_size: int) -> str:
    """The page's one line on what each MARS-side mode gives on this model."""
    text = f"On {loaded.name}: {fastest.summary(fastest.get(loaded))} · {tau_summary(loaded, block_size)}."
    return f'<div class="mode-line muted" id="mode-line-text">{html.escape(text)}</div>'
