"""The Batch & KV cache tab: the same held-out prompts as one batch through AR and MARS, with a
per-sample timeline of tokens accepted per forward."""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from statistics import median

import gradio as gr

from mars_core import DecodeConfig, TauControl, generate
from mars_core.config import CACHES

from . import fields, plots
from .core import Core
from .session import Session
from .ui import UI
from .validate import as_choice, as_float, as_int


AR_CACHE = "cursor"  # the fastest AR cache in the benchmark (README): AR at its best
DEFAULT_CACHE = "cursor"  # the fastest MARS cache in the benchmark
MAX_REPEATS = 7
CACHE_BLOCK = (4, 64)  # B_cache range: the slider's and the API's
MIN_NEW = 8  # fewest new tokens a batch run generates (slider and API)


class BatchTab:
    def __init__(self, core: Core):
        self.core = core
        self.opts = core.opts

    def run(self, batch_size, cache, cache_block_size, tau, block_size, max_new_tokens, repeats,
            session: Session):
        """Warm up, then `repeats` interleaved runs of AR and MARS on the same batch; report the
        median tokens/s of each with its spread (min to max) and the median speed-up."""
        from tasks.synthetic import make_examples

        batch_size = as_int("batch size", batch_size, 1, self.opts.batch_max)
        cache = as_choice("cache", cache, CACHES)
        block_size = as_int("block size", block_size, 1, self.opts.max_block_size)
        cache_block_size = as_int("cache block size", cache_block_size, max(block_size, CACHE_BLOCK[0]), CACHE_BLOCK[1])
        tau = as_float("tau", tau, 0.0, 1.0)
        max_new_tokens = as_int("max new tokens", max_new_tokens, MIN_NEW, self.core.max_new_cap(session))
        repeats = as_int("repeats", repeats, 1, MAX_REPEATS)
        mars, ar = self.core.models_for(session)
        ar = ar or mars
        prompts = [ex["messages"][0]["content"] for ex in make_examples(batch_size, 1, "eval")]
        ar_cfg = DecodeConfig(mode="ar", cache=AR_CACHE, max_new_tokens=max_new_tokens)
        mars_cfg = DecodeConfig(mode="mars", tau=tau, block_size=block_size, cache=cache,
                                cache_block_size=cache_block_size, max_new_tokens=max_new_tokens)
        sides = {"AR": (ar, ar_cfg), "MARS": (mars, mars_cfg)}
        for loaded, cfg in sides.values():  # warm-up: same batch shape, a few tokens
            generate(loaded.model, loaded.tokenizer, prompts, replace(cfg, max_new_tokens=min(4, max_new_tokens)))
        runs: dict[str, list] = {k: [] for k in sides}
        deadline = time.perf_counter() + self.opts.max_seconds
        for r in range(repeats):
            if r and time.perf_counter() > deadline:
                break
            for label in (("AR", "MARS") if r % 2 == 0 else ("MARS", "AR")):  # alternate who goes first
                loaded, cfg = sides[label]
                ctl = TauControl(cfg.tau, cfg.metric)
                timer = threading.Timer(max(deadline - time.perf_counter(), 0.0) + 1.0, ctl.stop)
                timer.start()
                try:
                    runs[label].append((generate(loaded.model, loaded.tokenizer, prompts, cfg, ctl), ctl.stopped))
                finally:
                    timer.cancel()
        return self._report(batch_size, cache, cache_block_size, sides, runs, repeats), self._timeline(
            runs["MARS"][-1][0], cache, cache_block_size)

    @staticmethod
    def _report(batch_size, cache, cache_block_size, sides, runs, repeats) -> str:
        n = min(len(v) for v in runs.values())
        ratios = [m[0].stats.tokens_per_second / a[0].stats.tokens_per_second
                  for a, m in zip(runs["AR"][:n], runs["MARS"][:n]) if a[0].stats.tokens_per_second > 0]
        rows = ["| side | model | cache | tokens/s (median) | spread (min to max) | tokens | forwards | "
                "tokens/forward | idle slots |", "|---|---|---|---|---|---|---|---|---|"]
        for label, (loaded, cfg) in sides.items():
            tps = [res.stats.tokens_per_second for res, _ in runs[label][:n]]
            s = runs[label][-1][0].stats
            stopped = any(st for _, st in runs[label])
            rows.append(f"| {label} | {loaded.name} | {cfg.cache} | {median(tps):.1f} | {min(tps):.1f} to "
                        f"{max(tps):.1f} | {s.tokens} | {s.forwards} | {s.tokens_per_forward:.2f} | {s.idle_slots} |"
                        + (" stopped (time limit)" if stopped else ""))
        cut = f" (time limit: {n} of {repeats} repeats)" if n < repeats else ""
        speed = (f"**Speed-up of MARS over AR: {median(ratios):.2f}x** (median of {len(ratios)} runs, "
                 f"{min(ratios):.2f}x to {max(ratios):.2f}x)" if ratios else "no speed-up: AR produced no tokens")
        return (f"Batch of {batch_size} held-out problems, after a warm-up, {n} interleaved runs per side{cut}. "
                f"{speed}. Tokens/s over wall time of each whole batch, prompt prefill included.\n\n"
                + "\n".join(rows) + "\n\nIdle slots: forwards in which a sample waited for the others "
                "(to fill a cache block) before its last token.")

    @staticmethod
    def _timeline(res, cache, cache_block_size):
        return plots.timeline(res.stats.accepted_per_step, "MARS tokens accepted per sample and forward, "
                              f"cache = {cache}" + (f", B_cache = {cache_block_size}" if cache == "block" else ""))


def add_tab(ui: UI) -> BatchTab:
    opts, tab = ui.opts, BatchTab(ui.core)
    with gr.Tab("Batch & KV cache", id="batch"):
        gr.Markdown("The same held-out prompts through AR (cursor KV cache) and MARS as one batch: a warm-up, "
                    "then several runs of each, interleaved, reported as the median with its spread. The "
                    "timeline shows how many tokens each sample accepted per forward; grey cells are idle "
                    "samples (waiting at a cache-block boundary, or finished).")
        with gr.Row():
            size = fields.Slider(1, opts.batch_max, value=min(4, opts.batch_max), step=1, label="batch size")
            cache = fields.Dropdown(list(CACHES), value=DEFAULT_CACHE, label="MARS cache mode")
            cblock = fields.Slider(*CACHE_BLOCK, value=16, step=4, label="B_cache (block cache)")
            tau = fields.Slider(0.0, 1.0, value=0.9, step=0.01, label="tau")
            block = fields.Slider(1, opts.max_block_size, value=ui.core.default_block, step=1, label="block size")
            max_new = fields.Slider(MIN_NEW, ui.core.max_new_cap(), value=min(64, ui.core.max_new_cap()), step=8,
                                    label="max new tokens")
            repeats = fields.Slider(1, MAX_REPEATS, value=3, step=1, label="runs per side (median)")
        btn = gr.Button("Run batch", variant="primary", elem_id="batch-run")
        status = ui.job_status("batch-status", "Press Run batch: a warm-up, then the interleaved runs.")
        ui.job_note()
        summary = gr.Markdown(elem_id="batch-summary", label="summary")
        plot = gr.Plot(plots.message_figure("Run a batch: the timeline of tokens accepted per sample and forward "
                                            "appears here.", height=160), elem_id="batch-plot", label="timeline")
    ui.run_job(btn, tab.run, [size, cache, cblock, tau, block, max_new, repeats, ui.session], [summary, plot], status,
               "batch", api_name="batch")
    ui.tabs["batch"] = tab
    return tab
