"""The Playground tab: one prompt through AR and MARS side by side, streaming, with live tau, slow
motion, a queue-aware Stop and a step-through replay of the last MARS generation."""
from __future__ import annotations

import time

import gradio as gr

from mars_core.config import CACHES, METRICS
from mars_core.prompts import encode_prompt

from . import fields, render
from .core import Core
from .duel import AR_SIDES, MARS_MODES, Duel
from .mars_side import MODE_CHOICES, default_mode, fastest_entry, is_real, measuring, mode_line
from .errors import guard
from .examples import REAL_EXAMPLES, tiny_examples as _examples  # noqa: F401 - _examples: its old name
from .replay import replay_html
from .runs import in_place, kind_of, queued_html, settle, status_html
from .scope import scope_html
from .session import Session
from .ui import UI
from .validate import as_int, check_prompt, decode_settings

TAU_MAX = {"probability": 1.0, "margin": 1.0, "entropy": 4.0}  # slider ranges
# After Generate the output must be in view. On a phone the panels sit under everything else, so
# the page scrolls to the gauge; on a desktop it scrolls only as far as the MARS panel needs, so
# that the live tau slider stays on screen while the tokens come.
SCROLL_JS = """() => { const narrow = window.innerWidth < 800;
  const el = document.getElementById(narrow ? 'speed' : 'mars-panel');
  if (el) el.scrollIntoView({block: narrow ? 'start' : 'nearest'}); }"""
SHOW_STATUS_JS = "() => { document.getElementById('run-status')?.scrollIntoView({block: 'center'}); }"
BUTTONS_IDLE = (gr.update(interactive=False), gr.update(interactive=True))  # (Stop, Generate) once a run is over


def _first_rejection(side) -> int:
    B = side.cfg.effective_block_size
    return next((i + 1 for i, s in enumerate(side.steps) if s.accepted < B and not s.finished), 1)


class PlaygroundTab:
    """Handlers of the tab; plain methods, so tests call them directly."""

    def __init__(self, core: Core):
        self.core = core
        self.opts = core.opts

    # ---- setting up ---------------------------------------------------------------------------
    def _duel(self, prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
              session: Session, mars_mode: str = "mars") -> Duel:
        check_prompt(prompt, self.core.prompt_char_cap(session))
        settings = decode_settings(tau=tau, block_size=block_size, metric=metric, temperature=temperature,
                                   seed=seed, max_new_tokens=max_new_tokens, cache=cache,
                                   max_block_size=self.opts.max_block_size,
                                   max_new_tokens_cap=self.core.max_new_cap(session))
        mars, ar = self.core.models_for(session)
        context = self.core.context(session)
        room = context - settings["max_new_tokens"] - settings["block_size"]
        used = max(len(encode_prompt(m.tokenizer, prompt)) for m in (mars, ar) if m is not None)
        if used > room:
            raise ValueError(f"The prompt is {used} tokens long, but the model reads only {context} tokens in all: "
                             f"with {settings['max_new_tokens']} new tokens and B = {settings['block_size']}, "
                             f"a prompt may have at most {max(room, 0)}. Shorten the prompt or lower max new tokens.")
        labels = {**{label: key for key, label in MARS_MODES.items()}, **{label: key for label, key in MODE_CHOICES}}
        mars_mode = labels.get(mars_mode, mars_mode)
        same = ar is not None and self.core.same_vocab(ar, mars)
        fastest, note = None, ""
        if mars_mode == "fastest":
            entry = fastest_entry(self.core, mars)
            fastest = entry.config if entry.state == "ready" else None
            note = self.core.fastest.fallback_note(entry)
        return Duel(prompt, settings, ar_side, mars, ar, self.opts.max_seconds, mars_mode, same, fastest, note)

    def _steps(self, duel: Duel, session: Session, slow: float):
        session.duel, duel.run_id = duel, session.run_id
        session.mars_control, session.ar_control = duel.mars.control, duel.ar.control
        try:
            yield from duel.run(slow)
        finally:
            self._finish(duel, session)

    def _finish(self, duel: Duel, session: Session) -> None:
        session.last_accepted = list(duel.mars.track.accepted)
        session.last_block = duel.mars.cfg.block_size
        session.last_mars, session.last_duel = duel.mars, duel
        if session.duel is duel:
            session.duel = session.mars_control = session.ar_control = None

    # ---- rendering ----------------------------------------------------------------------------
    def _render(self, duel: Duel, final: bool):
        """(status, ar panel, mars panel, speed, steps chart, compare, replay slider, replay) from one
        read of each side's figures, so that the panels and the speed gauge always agree."""
        ar, mars = duel.sides
        ar_stats, mars_stats = ar.stats, mars.stats
        note = f"stopped after the {self.opts.max_seconds:g} s limit" if duel.timed_out else ""
        ar_name = ar.loaded.name + (" (1 token/step)" if ar.loaded is mars.loaded else "")
        ar_html = render.panel_html("ar", "AR", ar_name, ar.track, ar_stats, ar.status,
                                    " · ".join(x for x in (ar.note, note) if x))
        kind = {"mars": "MARS", "lossless": "MARS lossless", "lookup": "MARS lossless + lookup",
                "tree": "MARS lossless + tree", "spec": "MARS spec", "fastest": "MARS exact, fastest here"}[duel.mars_mode]
        mars_html = render.panel_html("mars", f"{kind} (B = {mars.track.block})", mars.loaded.name, mars.track,
                                      mars_stats, mars.status, " · ".join(x for x in (mars.note, note) if x))
        steps = render.steps_chart_html(mars.track.accepted, mars.track.taus, mars.track.block,
                                        TAU_MAX[mars.cfg.metric])
        speed = render.speed_html(ar_stats, mars_stats)
        if not final:
            return (status_html("run", "Running: both sides are decoding…"), ar_html, mars_html, speed, steps,
                    '<div class="compare muted">comparing when both finish…</div>', gr.skip(), gr.skip())
        same = self.core.same_vocab(ar.loaded, mars.loaded)
        cmp = render.compare_html(ar.track.text, mars.track.text, ar.track.ids if same else None,
                                  mars.track.ids if same else None, duel.guaranteed(),
                                  duel.why_not_guaranteed(), duel.reduced)
        n, k = len(mars.steps), _first_rejection(mars)
        words = {"done": "finished", "limit": f"stopped at the token limit ({mars.cfg.max_new_tokens} tokens)",
                 "stopped": "stopped"}
        state = "; ".join(f"{s.name.upper()} {words.get(s.status, s.status)}" for s in (ar, mars))
        stopped = duel.timed_out or "stopped" in (ar.status, mars.status)
        head = (f"Stopped at the {self.opts.max_seconds:g} s limit" if duel.timed_out
                else "Stopped" if stopped else "Done")
        slider = gr.update(minimum=1, maximum=max(n, 1), value=k, interactive=n > 1)
        return (status_html("stopped" if stopped else "done", f"{head}: {state}. Step through the MARS forwards "
                            "below."), ar_html, mars_html, speed, steps, cmp, slider, replay_html(mars, k, mars.cfg.metric))

    # ---- events -------------------------------------------------------------------------------
    def generate(self, prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                 slow_ms, session: Session, mars_mode: str = "mars"):
        """Stream both panels; yields (status, ar_html, mars_html, speed, steps_chart, compare,
        replay_step, replay)."""
        slow = as_int("slow motion (ms per forward)", slow_ms, 0, self.opts.max_slow_ms) / 1000
        duel = self._duel(prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                          session, mars_mode)
        last = 0.0
        for _ in self._steps(duel, session, slow):
            now = time.perf_counter()
            if now - last >= self.opts.render_interval:
                yield self._render(duel, False)
                last = now
        yield self._render(duel, True)

    def api_generate(self, prompt: str, tau: float = 0.95, block_size: int = 4, metric: str = "probability",
                     temperature: float = 0.0, seed: int = 0, max_new_tokens: int | None = None, cache: str = "sliding",
                     ar_side: str = AR_SIDES[0], mars_mode: str = "mars", request: gr.Request = None) -> dict:
        """Decode `prompt` with AR and MARS (the models this session chose with /load_models).
        `mars_mode`: "mars", "fastest" (exact, with the drafts `mars_core.fastest_exact` picked for this
        model on this machine, greedy), "lossless", "lookup" (lossless + prompt lookup, greedy), "tree"
        (lossless with a draft tree of the masks' top candidates, greedy) or "spec" (the AR
        checkpoint drafts). Returns per side:
        model name, text, token ids, accepted tokens per forward and stats; whether the outputs
        agree (and whether the mode guarantees it: "guarantee" is "identical" in float32, "argmax" in
        bf16, where each token is the model's argmax in its verifying forward), and the speed-up. `max_new_tokens`: the page's default (256) when not given."""
        session = self.core.session_of(request)
        if max_new_tokens is None:  # the page's default
            max_new_tokens = min(self.opts.default_max_new_tokens, self.core.max_new_cap(session))
        duel = self._duel(prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                          session, mars_mode)
        for _ in duel.run():
            pass
        return duel.summary()

    def arm(self, session: Session):
        """Right after Generate: Stop becomes usable, the status says the job is on its way, and
        Generate is off until the run has ended (`after_run`, `settle`): a second run of the page
        would stream into the same panels, and the first one's end would switch Stop off under it.
        Returns (stop, status, generate)."""
        session.stop_pressed = False
        session.run_id += 1
        return gr.update(interactive=True), queued_html("generation"), gr.update(interactive=False)

    def after_run(self, session: Session):
        """Once the run has ended or been cancelled: Stop off, Generate on, and after a Stop the final
        panels and status, sent last on purpose: when Stop cancels a running generation, an update the
        generation had in flight can land after Stop's own answer and would leave "Running" on screen."""
        duel = session.duel
        if duel is not None and getattr(duel, "run_id", None) == session.run_id:  # Stop not handled yet
            duel.stop()
            self._finish(duel, session)
        last = session.last_duel
        if (last is None or getattr(last, "run_id", None) != session.run_id  # never ran (cancelled in the queue)
                or not last.mars.control.stopped):  # ended on its own: its last update is the final one
            return (*(gr.skip(),) * 8, *BUTTONS_IDLE)
        return (*self._render(last, True), *BUTTONS_IDLE)

    def settle(self, status: str, session: Session):
        """After a failure (an error, a full queue, or Stop on a queued job): a true status, Stop off,
        Generate on."""
        return settle(status, session.stop_pressed), *BUTTONS_IDLE

    def stop(self, status: str, session: Session):
        """Stop: a running generation ends after its current forward and keeps its tokens; a queued
        one is cancelled before it starts (the event is cancelled by Gradio, see `cancels`)."""
        session.stop_pressed = True
        duel = session.duel
        if duel is None:
            if kind_of(status) != "queued":  # a click that lost the race with the run's own end
                return (*(gr.skip(),) * 8, gr.update(interactive=False))
            return (status_html("cancelled", "Cancelled: the queued generation was removed before it started."),
                    *(gr.skip(),) * 7, gr.update(interactive=False))
        duel.stop()
        out = self._render(duel, True)
        self._finish(duel, session)
        return (status_html("stopped", "Stopped: both sides keep what they produced."), *out[1:],
                gr.update(interactive=False))

    def set_tau(self, tau, metric, session: Session) -> None:
        """Live tau: the running MARS generation of this session uses it from its next forward."""
        ctl = session.mars_control if session is not None else None
        if ctl is None or ctl.metric != metric:
            return
        try:
            ctl.tau = tau
        except ValueError:
            pass  # out of range for this metric: keep the current value

    def metric_changed(self, metric):
        if metric == "entropy":
            return gr.update(minimum=0.0, maximum=TAU_MAX["entropy"], value=0.3, step=0.05,
                             label="tau — live (entropy in nats: accept while H <= tau; 0 = AR)")
        return gr.update(minimum=0.0, maximum=1.0, value=0.95, step=0.01,
                         label=f"tau — live ({metric}: accept while confidence >= tau; 1 = AR)")

    def replay(self, k, session: Session):
        side = session.last_mars if session is not None else None
        return replay_html(side, as_int("forward", k, 1, 10**6), side.cfg.metric if side else "probability")

    def replay_move(self, k, delta: int, session: Session):
        side = session.last_mars if session is not None else None
        n = len(side.steps) if side else 1
        k = min(max(as_int("forward", k, 1, 10**6) + delta, 1), n)
        return gr.update(value=k), self.replay(k, session)

    def prompt_info(self, prompt, max_new_tokens, block_size, session: Session) -> str:
        """How much of the model's context the prompt uses (in tokens)."""
        try:
            max_new = as_int("max new tokens", max_new_tokens, 1, 10**6)
            block = as_int("block size", block_size, 1, 10**6)
        except ValueError:
            return ""
        mars, _ = self.core.models_for(session)
        room = self.core.context(session) - max_new - block
        used = len(encode_prompt(mars.tokenizer, prompt)) if isinstance(prompt, str) and prompt.strip() else 0
        kind = "error" if used > room else "info"
        return (f'<div class="prompt-info" data-kind="{kind}">Prompt: {used} of {max(room, 0)} tokens '
                f'({self.core.context(session)}-token context, minus {max_new} new tokens and B = {block}).</div>')

    def on_models_changed(self, session: Session):
        """Scope text, slider limits and block size for the session's newly loaded models."""
        mars, ar = self.core.models_for(session)
        cap = self.core.max_new_cap(session)
        return (scope_html(mars, ar), gr.update(maximum=cap, value=min(self.opts.default_max_new_tokens, cap)),
                gr.update(value=mars.trained_block_size or self.core.default_block),
                gr.update(max_length=self.core.prompt_char_cap(session)),
                # idle panels named after the session's pair (a page that opened on the real pair
                # must not show the bundled names until the first Generate)
                render.panel_html("ar", "AR", ar.name if ar else mars.name, None, None, "idle"),
                render.panel_html("mars", f"MARS (B = {mars.trained_block_size or self.core.default_block})",
                                  mars.name, None, None, "idle"),
                gr.update(visible=not is_real(mars)), gr.update(visible=is_real(mars)))

    def mode_for_models(self, session: Session):
        """The MARS side's mode for the session's models (its default on that pair) and the line on what
        each mode gives there."""
        mars, _ = self.core.models_for(session)
        fastest_entry(self.core, mars)  # measured from now on if it is not yet
        return gr.update(value=default_mode(mars)), mode_line(self.core, mars)

    def mode_timer(self, session: Session):
        return gr.Timer(active=measuring(self.core, self.core.models_for(session)[0]))

    def mode_tick(self, session: Session):
        mars, _ = self.core.models_for(session)
        return mode_line(self.core, mars), gr.Timer(active=measuring(self.core, mars))


def add_tab(ui: UI) -> PlaygroundTab:
    core, opts = ui.core, ui.opts
    tab = PlaygroundTab(core)
    B, cap = core.default_block, core.max_new_cap()
    with gr.Tab("Playground", id="playground", elem_id="tab-playground"):
        scope = gr.HTML(scope_html(core.mars, core.ar), elem_id="scope", label="about this model")
        with gr.Row(elem_id="play-top"):
            with gr.Column(scale=3, min_width=320):
                prompt = gr.Textbox(label="Prompt (Enter runs it, Shift+Enter for a new line)", lines=3, max_lines=8,
                                    elem_id="prompt", max_length=core.prompt_char_cap(),
                                    placeholder="Pick an example below, or type a question")
                info = gr.HTML("", elem_id="prompt-info", label="prompt length")
                real = is_real(core.mars)
                with gr.Column(visible=not real) as tiny_examples:
                    gr.Examples(_examples(), inputs=[prompt], label="Held-out problems (arithmetic, unit conversion, "
                                "lists): the model has never seen them", elem_id="examples")
                with gr.Column(visible=real) as real_examples:
                    gr.Examples(REAL_EXAMPLES, inputs=[prompt], label="Real-language prompts, of kinds the MARS "
                                "fine-tune never trained on", elem_id="real-examples")
                with gr.Row():
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="generate", scale=3)
                    stop_btn = gr.Button("Stop", variant="secondary", elem_id="stop", interactive=False, scale=1)
                run_status = gr.HTML(status_html("info", "Press Generate (or Enter in the prompt) to run both sides."),
                                     elem_id="run-status", label="status")
            with gr.Column(scale=2, min_width=320):
                # outside "More settings": the exact mode and tau mode are one click apart. First in the column:
                # the column then stays as tall as the prompt's, so that after Generate a laptop shows the
                # first tokens with the live tau slider still in view
                mars_mode = fields.Radio(MODE_CHOICES, value=default_mode(core.mars), label="MARS side runs",
                                         elem_id="mars-mode")
                fastest_entry(core, core.mars)  # the default model's "fastest" configuration, measured now
                tau = fields.Slider(0.0, 1.0, value=0.95, step=0.01, elem_id="tau",
                                    label="tau — live (probability: accept while confidence >= tau; 1 = AR)")
                slow = fields.Slider(0, opts.max_slow_ms, value=opts.default_slow_ms, step=10, elem_id="slow",
                                     label="slow motion: ms added to every forward of both sides "
                                           "(0 = full speed; never counted in tokens/s)")
                max_new = fields.Slider(1, cap, value=min(opts.default_max_new_tokens, cap), step=1,
                                        label="max new tokens", elem_id="max-new")
                with gr.Accordion("More settings", open=False, elem_id="more-settings"):
                    block = fields.Slider(1, opts.max_block_size, value=B, step=1, label="block size B",
                                          elem_id="block-size")
                    metric = fields.Dropdown(list(METRICS), value="probability", label="acceptance metric")
                    cache = fields.Dropdown(list(CACHES), value="sliding", label="cache mode")
                    temperature = fields.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
                    seed = fields.Number(value=0, precision=0, label="seed")
                    ar_side = fields.Radio(list(AR_SIDES), value=AR_SIDES[0] if core.ar else AR_SIDES[1],
                                           label="AR side runs")
        # under the row, full width (one or two lines): beside the choice it would push the panels, and with
        # them the live tau slider, out of a laptop's view after Generate. Refreshed when a page opens
        # (ui.on_page_load: the measurement as it is then); the timer's first tick switches itself off
        # where nothing is being measured.
        mode_info = gr.HTML(mode_line(core, core.mars), elem_id="mode-line", label="what each mode gives")
        mode_timer = gr.Timer(2.0)
        speed = gr.HTML(render.speed_html(None, None), elem_id="speed", label="speed")
        with gr.Row(equal_height=False):
            with gr.Column(min_width=300):
                ar_html = gr.HTML(render.panel_html("ar", "AR", core.ar.name if core.ar else core.mars.name, None,
                                                    None, "idle"), elem_id="ar-panel", label="AR output")
            with gr.Column(min_width=300):
                mars_html = gr.HTML(render.panel_html("mars", f"MARS (B = {B})", core.mars.name, None, None,
                                                      "idle"), elem_id="mars-panel", label="MARS output")
        compare = gr.HTML("", elem_id="compare", label="agreement")
        steps_chart = gr.HTML(render.steps_chart_html([], [], B), elem_id="steps-chart", label="accepted per forward")
        with gr.Column(elem_id="replay-box", variant="panel"):  # a Group renders its elem_id twice (Gradio 6)
            gr.Markdown("### Step-through replay\nEvery forward of the last MARS generation: what went in, the B "
                        "predictions that came out, which tau accepted and why the others were rejected.")
            with gr.Row():
                prev_btn = gr.Button("◀ previous", elem_id="replay-prev", size="sm", min_width=90, scale=0)
                step = fields.Slider(1, 2, value=1, step=1, label="forward", elem_id="replay-step", interactive=False,
                                     scale=4)
                next_btn = gr.Button("next ▶", elem_id="replay-next", size="sm", min_width=90, scale=0)
            replay = gr.HTML(replay_html(None, 1), elem_id="replay", label="replay")
        ui.api(guard(ui.gpu(tab.api_generate)), "generate", "result", **ui.decode_limit)

    inputs = [prompt, tau, block, metric, temperature, seed, max_new, cache, ar_side, slow, ui.session, mars_mode]
    outputs = [run_status, ar_html, mars_html, speed, steps_chart, compare, step, replay]
    armed = gr.on([gen_btn.click, prompt.submit], tab.arm, [ui.session], [stop_btn, run_status, gen_btn],
                  queue=False, js=SCROLL_JS, api_visibility="private")
    tab.page_generate = in_place(ui.gpu(tab.generate), len(outputs), 0)  # errors in the status line, once
    running = armed.then(tab.page_generate, inputs, outputs, api_name="generate_stream",
                         show_progress="full", show_progress_on=[run_status], **ui.decode_limit)
    running.then(tab.after_run, [ui.session], outputs + [stop_btn, gen_btn], queue=False,
                 api_visibility="private")  # done or cancelled
    settled = running.failure(tab.settle, [run_status, ui.session], [run_status, stop_btn, gen_btn], queue=False,
                              api_visibility="private")  # an error, or never run
    # after Generate a phone scrolled down to the panels: bring the line that says why back in view
    settled.then(None, None, None, js=SHOW_STATUS_JS, queue=False, api_visibility="private")
    stop_btn.click(tab.stop, [run_status, ui.session], outputs + [stop_btn], cancels=[running], queue=False,
                   api_visibility="private")
    tau.change(tab.set_tau, [tau, metric, ui.session], None, queue=False, show_progress="hidden",
               api_visibility="private")
    metric.change(tab.metric_changed, [metric], [tau], queue=False, api_visibility="private")
    step.release(guard(tab.replay, page=True), [step, ui.session], [replay], queue=False, api_visibility="private")
    step.change(guard(tab.replay, page=True), [step, ui.session], [replay], queue=False, api_visibility="private",
                show_progress="hidden")
    for btn, delta in ((prev_btn, -1), (next_btn, 1)):
        btn.click(guard(lambda k, s, d=delta: tab.replay_move(k, d, s), page=True), [step, ui.session], [step, replay],
                  queue=False, api_visibility="private")
    gr.on([prompt.change, max_new.change, block.change], tab.prompt_info, [prompt, max_new, block, ui.session],
          [info], queue=False, show_progress="hidden", api_visibility="private", trigger_mode="always_last")
    ui.on_models_changed([scope, max_new, block, prompt, ar_html, mars_html, tiny_examples, real_examples],
                         tab.on_models_changed)
    ui.on_models_changed([mars_mode, mode_info], tab.mode_for_models)
    ui.on_page_load([mode_info], lambda session: mode_line(core, core.models_for(session)[0]))
    # the line refreshes while the session's model is measured: a new line (other models) re-arms the timer
    mode_info.change(tab.mode_timer, [ui.session], [mode_timer], queue=False, show_progress="hidden",
                     api_visibility="private")
    mode_timer.tick(tab.mode_tick, [ui.session], [mode_info, mode_timer], queue=False, show_progress="hidden",
                    api_visibility="private")
    ui.tabs["playground"] = tab
    return tab
