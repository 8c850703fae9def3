"""The Batch & KV cache tab: the same held-out prompts as one batch through AR and MARS, with a
per-sample timeline of tokens accepted per forward."""
from __future__ import annotations

import threading

import gradio as gr

from mars_core import DecodeConfig, TauControl, generate
from mars_core.config import CACHES

from . import plots
from .core import Core
from .errors import guard
from .session import Session
from .ui import UI
from .validate import as_choice, as_float, as_int


class BatchTab:
    def __init__(self, core: Core):
        self.core = core
        self.opts = core.opts

    def run(self, batch_size, cache, cache_block_size, tau, block_size, max_new_tokens, session: Session):
        from tasks.synthetic import make_examples

        batch_size = as_int("batch size", batch_size, 1, self.opts.batch_max)
        cache = as_choice("cache", cache, CACHES)
        block_size = as_int("block size", block_size, 1, self.opts.max_block_size)
        cache_block_size = as_int("cache block size", cache_block_size, block_size, 256)
        tau = as_float("tau", tau, 0.0, 1.0)
        max_new_tokens = as_int("max new tokens", max_new_tokens, 1, self.opts.max_new_tokens_cap)
        mars, ar = self.core.models_for(session)
        ar = ar or mars
        prompts = [ex["messages"][0]["content"] for ex in make_examples(batch_size, 1, "eval")]
        ar_cfg = DecodeConfig(mode="ar", cache="sliding", max_new_tokens=max_new_tokens)
        mars_cfg = DecodeConfig(mode="mars", tau=tau, block_size=block_size, cache=cache,
                                cache_block_size=cache_block_size, max_new_tokens=max_new_tokens)
        results = {}
        for label, loaded, cfg in (("AR (KV cache)", ar, ar_cfg), (f"MARS (cache: {cache})", mars, mars_cfg)):
            ctl = TauControl(cfg.tau, cfg.metric)
            timer = threading.Timer(self.opts.max_seconds / 2, ctl.stop)
            timer.start()
            try:
                results[label] = (loaded, generate(loaded.model, loaded.tokenizer, prompts, cfg, ctl), ctl)
            finally:
                timer.cancel()
        rows = ["| run | model | wall (s) | tokens | forwards | tokens/forward | tokens/s | idle slots |",
                "|---|---|---|---|---|---|---|---|"]
        tps = {}
        for label, (loaded, res, ctl) in results.items():
            s = res.stats
            tps[label] = s.tokens_per_second
            rows.append(f"| {label} | {loaded.name} | {s.seconds:.2f} | {s.tokens} | {s.forwards} | "
                        f"{s.tokens_per_forward:.2f} | {s.tokens_per_second:.1f} | {s.idle_slots} |"
                        + (" stopped (time limit)" if ctl.stopped else ""))
        ar_tps, mars_tps = list(tps.values())
        speed = mars_tps / ar_tps if ar_tps else 0.0
        summary = (f"Batch of {batch_size} held-out problems. **Speed-up of MARS over AR: {speed:.2f}x** "
                   f"(tokens/s; wall-clock includes the prompt prefill).\n\n" + "\n".join(rows) +
                   "\n\nIdle slots: forwards in which a sample waited for the others to fill the cache block.")
        mars_res = list(results.values())[1][1]
        fig = plots.timeline(mars_res.stats.accepted_per_step, f"MARS tokens accepted per sample and forward, "
                             f"cache = {cache}" + (f", B_cache = {cache_block_size}" if cache == "block" else ""))
        return summary, fig


def add_tab(ui: UI) -> BatchTab:
    opts, tab = ui.opts, BatchTab(ui.core)
    with gr.Tab("Batch & KV cache", id="batch"):
        gr.Markdown("The same held-out prompts through AR (with KV cache) and MARS as one batch. "
                    "The timeline shows how many tokens each sample accepted per forward; grey cells are "
                    "idle samples (waiting at a cache-block boundary, or finished).")
        with gr.Row():
            size = gr.Slider(1, opts.batch_max, value=min(4, opts.batch_max), step=1, label="batch size")
            cache = gr.Dropdown(list(CACHES), value="block", label="MARS cache mode")
            cblock = gr.Slider(4, 64, value=16, step=4, label="B_cache (block cache)")
            tau = gr.Slider(0.0, 1.0, value=0.9, step=0.01, label="tau")
            block = gr.Slider(1, opts.max_block_size, value=ui.core.default_block, step=1, label="block size")
            max_new = gr.Slider(8, opts.max_new_tokens_cap, value=min(64, opts.max_new_tokens_cap), step=8,
                                label="max new tokens")
        btn = gr.Button("Run batch", variant="primary", elem_id="batch-run")
        summary = gr.Markdown(elem_id="batch-summary", label="summary")
        plot = gr.Plot(elem_id="batch-plot", label="timeline")
    btn.click(guard(ui.gpu(tab.run)), [size, cache, cblock, tau, block, max_new, ui.session], [summary, plot],
              api_name="batch", **ui.decode_limit)
    ui.tabs["batch"] = tab
    return tab
