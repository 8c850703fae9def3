"""The Playground tab: one prompt through AR and MARS side by side, streaming, with live tau."""
from __future__ import annotations

import time

import gradio as gr

from mars_core.config import CACHES, METRICS

from . import plots, render
from .core import Core
from .duel import AR_SIDES, Duel
from .errors import guard
from .session import Session
from .ui import UI
from .validate import check_prompt, decode_settings

TAU_MAX = {"probability": 1.0, "margin": 1.0, "entropy": 4.0}  # slider ranges


def _examples() -> list[list[str]]:
    from tasks.synthetic import make_examples

    picked, seen = [], {}
    for ex in make_examples(30, 0, "eval"):
        if seen.get(ex["family"], 0) < 2:
            seen[ex["family"]] = seen.get(ex["family"], 0) + 1
            picked.append((ex["family"], ex["messages"][0]["content"]))
    order = {"arithmetic": 0, "units": 1, "lists": 2}
    return [[q] for _, q in sorted(picked, key=lambda x: order.get(x[0], 9))]


class PlaygroundTab:
    """Handlers of the tab; plain methods, so tests call them directly."""

    def __init__(self, core: Core):
        self.core = core
        self.opts = core.opts

    def _duel(self, prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
              session: Session) -> Duel:
        check_prompt(prompt, self.opts.max_prompt_chars)
        settings = decode_settings(tau=tau, block_size=block_size, metric=metric, temperature=temperature,
                                   seed=seed, max_new_tokens=max_new_tokens, cache=cache,
                                   max_block_size=self.opts.max_block_size,
                                   max_new_tokens_cap=self.opts.max_new_tokens_cap)
        mars, ar = self.core.models_for(session)
        return Duel(prompt, settings, ar_side, mars, ar, self.opts.max_seconds)

    def _run(self, duel: Duel, session: Session, delay: float):
        session.mars_control, session.ar_control = duel.mars.control, duel.ar.control
        try:
            yield from duel.run(delay)
        finally:
            session.last_accepted = list(duel.mars.track.accepted)
            session.last_block = duel.mars.cfg.block_size
            if session.mars_control is duel.mars.control:
                session.mars_control = session.ar_control = None

    def _render(self, duel: Duel, final: bool, with_gauge: bool):
        ar, mars = duel.sides
        note = f"stopped after the {self.opts.max_seconds:g} s limit" if duel.timed_out else ""
        ar_html = render.panel_html("ar", "AR", ar.loaded.name + (" (1 token/step)" if ar.loaded is mars.loaded else ""),
                                    ar.track, ar.stats, ar.status, " · ".join(x for x in (ar.note, note) if x))
        mars_html = render.panel_html("mars", f"MARS (B = {mars.track.block})", mars.loaded.name, mars.track,
                                      mars.stats, mars.status, note)
        steps = render.steps_chart_html(mars.track.accepted, mars.track.taus, mars.track.block,
                                        TAU_MAX[mars.cfg.metric])
        gauge = plots.gauge(mars.stats["tokens_per_second"], ar.stats["tokens_per_second"]) if with_gauge else gr.skip()
        if final:
            same = self.core.same_vocab(ar.loaded, mars.loaded)
            cmp = render.compare_html(ar.track.text, mars.track.text, ar.track.ids if same else None,
                                      mars.track.ids if same else None)
        else:
            cmp = '<div class="compare muted">comparing when both finish…</div>'
        return ar_html, mars_html, gauge, steps, cmp

    def generate(self, prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                 session: Session):
        """Stream both panels; yields (ar_html, mars_html, gauge, steps_chart, compare)."""
        duel = self._duel(prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                          session)
        last, last_gauge = 0.0, 0.0
        for _ in self._run(duel, session, self.opts.step_delay):
            now = time.perf_counter()
            if now - last >= self.opts.render_interval:
                with_gauge = now - last_gauge >= 0.5
                yield self._render(duel, False, with_gauge)
                last = now
                if with_gauge:
                    last_gauge = now
        if duel.timed_out:
            gr.Warning(f"The generation was stopped after the {self.opts.max_seconds:g} s limit.")
        yield self._render(duel, True, True)

    def api_generate(self, prompt: str, tau: float = 0.95, block_size: int = 4, metric: str = "probability",
                     temperature: float = 0.0, seed: int = 0, max_new_tokens: int = 128, cache: str = "sliding",
                     ar_side: str = AR_SIDES[0]) -> dict:
        """Decode `prompt` with AR and MARS. Returns per side: model name, text, token ids,
        accepted tokens per forward and stats; and whether the outputs agree."""
        duel = self._duel(prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                          Session())
        for _ in duel.run():
            pass
        return duel.summary()

    def set_tau(self, tau, metric, session: Session) -> None:
        """Live tau: the running MARS generation of this session uses it from its next forward."""
        ctl = session.mars_control if session is not None else None
        if ctl is None or ctl.metric != metric:
            return
        try:
            ctl.tau = tau
        except ValueError:
            pass  # out of range for this metric: keep the current value

    def stop(self, session: Session) -> None:
        session.stop()

    def metric_changed(self, metric):
        if metric == "entropy":
            return gr.update(minimum=0.0, maximum=TAU_MAX["entropy"], value=0.3, step=0.05,
                             label="tau (entropy, nats: accept while H <= tau; 0 = AR)")
        return gr.update(minimum=0.0, maximum=1.0, value=0.95, step=0.01,
                         label=f"tau ({metric}: accept while confidence >= tau; 1 = AR)")


def add_tab(ui: UI) -> PlaygroundTab:
    core, opts = ui.core, ui.opts
    tab = PlaygroundTab(core)
    B = core.default_block
    with gr.Tab("Playground", id="playground"):
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt (free text, or pick an example)", lines=3,
                                    elem_id="prompt", max_length=opts.max_prompt_chars)
                gr.Examples(_examples(), inputs=[prompt], label="Held-out synthetic problems "
                            "(arithmetic, unit conversion, lists)", elem_id="examples")
                with gr.Row():
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
            with gr.Column(scale=2):
                tau = gr.Slider(0.0, 1.0, value=0.95, step=0.01, elem_id="tau",
                                label="tau (probability: accept while confidence >= tau; 1 = AR) — live")
                block = gr.Slider(1, opts.max_block_size, value=B, step=1, label="block size B",
                                  elem_id="block-size")
                with gr.Row():
                    metric = gr.Dropdown(list(METRICS), value="probability", label="acceptance metric")
                    cache = gr.Dropdown(list(CACHES), value="sliding", label="cache mode")
                with gr.Row():
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
                    seed = gr.Number(value=0, precision=0, minimum=0, label="seed")
                max_new = gr.Slider(1, opts.max_new_tokens_cap, value=opts.default_max_new_tokens, step=1,
                                    label="max new tokens", elem_id="max-new")
                ar_side = gr.Radio(list(AR_SIDES), value=AR_SIDES[0] if core.ar else AR_SIDES[1],
                                   label="AR side runs")
        with gr.Row(equal_height=False):
            ar_html = gr.HTML(render.panel_html("ar", "AR", core.ar.name if core.ar else core.mars.name, None,
                                                None, "idle"), elem_id="ar-panel")
            mars_html = gr.HTML(render.panel_html("mars", f"MARS (B = {B})", core.mars.name, None, None,
                                                  "idle"), elem_id="mars-panel")
        compare = gr.HTML("", elem_id="compare")
        with gr.Row():
            gauge = gr.Plot(plots.gauge(0.0, 0.0), label="throughput", elem_id="gauge")
            steps_chart = gr.HTML(render.steps_chart_html([], [], B), elem_id="steps-chart")
        gr.api(guard(tab.api_generate), api_name="generate", **ui.decode_limit)

    inputs = [prompt, tau, block, metric, temperature, seed, max_new, cache, ar_side, ui.session]
    outputs = [ar_html, mars_html, gauge, steps_chart, compare]
    run = guard(ui.gpu(tab.generate))
    gen_btn.click(run, inputs, outputs, api_name="generate_stream", show_progress="hidden", **ui.decode_limit)
    prompt.submit(run, inputs, outputs, api_visibility="private", show_progress="hidden", **ui.decode_limit)
    tau.change(tab.set_tau, [tau, metric, ui.session], None, queue=False, show_progress="hidden",
               api_visibility="private")
    metric.change(tab.metric_changed, [metric], [tau], queue=False, api_visibility="private")
    stop_btn.click(tab.stop, [ui.session], None, queue=False, api_visibility="private")
    ui.on_models_changed([block], lambda s: gr.update(value=core.models_for(s)[0].trained_block_size
                                                      or core.default_block))
    ui.tabs["playground"] = tab
    return tab
