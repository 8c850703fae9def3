"""The Frontier tab: accuracy and tokens/s against tokens per forward over a tau sweep (the
paper's Figure 3), from the model card or a new sweep through `training.evaluate.sweep`."""
from __future__ import annotations

import time

import gradio as gr

from . import fields, plots
from .core import Core
from .session import Session
from .ui import UI
from .validate import as_int, parse_taus


TAU1_NOTE = ("Tokens/s of MARS at tau 1 is below AR's: each of its forwards still carries the B - 1 masks "
             "whose predictions tau 1 rejects.")


class FrontierTab:
    def __init__(self, core: Core):
        self.core = core
        self.opts = core.opts

    def initial(self, session: Session | None = None):
        """The model card's sweep (eval.json in the model folder), or a note that there is none."""
        mars, _ = self.core.models_for(session)
        data = mars.eval_json()
        if data is None:
            return plots.frontier(None), f"**{mars.name}** has no precomputed sweep (no `eval.json` in its folder)."
        from training.evaluate import summary_table
        base = data.get("base_config") or {}
        how = ", ".join(x for x in (
            f"batches of {data['batch_size']}" if data.get("batch_size") else "",
            f"{base['cache']} KV cache" if base.get("cache") else "",
            f"{base['max_new_tokens']} new tokens max" if base.get("max_new_tokens") else "",
            f"{data['torch_threads']} CPU threads" if data.get("torch_threads") else "") if x)
        return plots.frontier(data), (f"Precomputed sweep from the model card of **{mars.name}** "
                                      f"({data.get('n', '?')} held-out problems{', ' + how if how else ''}). "
                                      f"{TAU1_NOTE}\n\n" + summary_table(data))

    def run(self, n, taus, block_size, max_new_tokens, session: Session, progress=gr.Progress()):
        """A new sweep: the AR baseline (if loaded), the MARS model at one token per step, then
        MARS at each tau; stopped with a notice after the time limit."""
        from mars_core import DecodeConfig
        from tasks.synthetic import make_examples
        from training.evaluate import summary_table, sweep

        from .scope import REAL_DATA, training_data

        mars, ar = self.core.models_for(session)
        if training_data(mars) == REAL_DATA:  # synthetic problems mean nothing to a chat model
            raise ValueError(f"A new sweep runs on the synthetic arithmetic task, which {mars.name} was not trained on; "
                           "its sweep above was measured on Spec-Bench and known-answer questions (model card).")
        n = as_int("problems", n, 1, self.opts.frontier_max_n)
        tau_list = parse_taus(taus)
        block_size = as_int("block size", block_size, 1, self.opts.max_block_size)
        max_new_tokens = as_int("max new tokens", max_new_tokens, 1, self.core.max_new_cap(session))
        examples = make_examples(n, 0, "eval")
        base = DecodeConfig(max_new_tokens=max_new_tokens, cache="sliding")
        total = (1 if ar is not None else 0) + 1 + len(tau_list)
        done, stopped = [0], [False]
        deadline = time.perf_counter() + self.opts.max_seconds

        def before_run(cfg) -> bool:
            if time.perf_counter() > deadline:
                stopped[0] = True
                return False
            progress((done[0], total), desc=f"{cfg.mode}" + (f" tau={cfg.tau}" if cfg.mode == "mars" else ""),
                     unit="runs")
            done[0] += 1
            return True

        progress((0, total), desc="sweep", unit="runs")
        runs = []
        if ar is not None:
            runs += sweep(ar.model, ar.tokenizer, examples, (), (), base, 8, "ar-baseline", before_run)
        if not stopped[0]:
            runs += sweep(mars.model, mars.tokenizer, examples, tau_list, (block_size,), base, 8, "mars", before_run)
        progress((total, total), desc="done", unit="runs")
        result = {"n": n, "seed": 0, "split": "eval",
                  "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]}
        cut = (f"**Stopped at the {self.opts.max_seconds:g} s limit: {done[0]} of {total} runs.** "
               if stopped[0] else "")
        return plots.frontier(result), (f"{cut}Sweep on {n} held-out problems, {max_new_tokens} new tokens max, batches "
                                        f"of 8, sliding KV cache. {TAU1_NOTE}\n\n" + summary_table(result))


def add_tab(ui: UI) -> FrontierTab:
    opts, tab = ui.opts, FrontierTab(ui.core)
    with gr.Tab("Frontier", id="frontier"):
        fig0, note0 = tab.initial()
        gr.Markdown("Accuracy and tokens/s against tokens per forward over a tau sweep on held-out "
                    "synthetic problems (the paper's Figure 3). Shown first: the model card's sweep.")
        plot = gr.Plot(fig0, elem_id="frontier-plot", label="frontier")
        note = gr.Markdown(note0, elem_id="frontier-note", label="runs")
        with gr.Row():
            n = fields.Slider(1, opts.frontier_max_n, value=min(20, opts.frontier_max_n), step=1,
                          label="held-out problems N")
            taus = gr.Textbox(", ".join(str(t) for t in (1.0, 0.9, 0.7, 0.5)), label="taus")
            block = fields.Slider(1, opts.max_block_size, value=ui.core.default_block, step=1, label="block size")
            max_new = fields.Slider(8, ui.core.max_new_cap(), value=min(256, ui.core.max_new_cap()), step=8,
                                    label="max new tokens")
        btn = gr.Button("Run sweep", variant="primary", elem_id="frontier-run")
        status = ui.job_status("frontier-status", "Press Run sweep for a new sweep on this server.")
        ui.job_note()
    ui.run_job(btn, tab.run, [n, taus, block, max_new, ui.session], [plot, note], status, "sweep",
               api_name="frontier")
    ui.on_models_changed([plot, note], tab.initial)
    ui.tabs["frontier"] = tab
    return tab
