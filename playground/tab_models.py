"""The Models tab: which models this browser session uses (others are not affected)."""
from __future__ import annotations

import gradio as gr

from . import fields
from .core import Core
from .models import QUANTIZATIONS, RELEASED_AR, RELEASED_MARS
from .runs import gated, in_place, queued_html, settle, status_html
from .session import Session
from .ui import UI
from .validate import as_choice

PRESETS = ("bundled", "released (hub)", "custom")


class ModelsTab:
    def __init__(self, core: Core, ui: UI | None = None):
        self.core = core
        self.ui = ui

    def load(self, preset, mars_name, ar_name, quantization, session: Session, request: gr.Request = None):
        """Load the chosen pair for this session (and for its API calls); returns the status line
        and, for every tab that registered a hook, its refreshed components."""
        core = self.core
        as_choice("preset", preset, PRESETS)
        as_choice("quantization", quantization, QUANTIZATIONS)
        if preset == PRESETS[0]:
            mars_src, ar_src = core.mars_source, core.ar_source
        elif preset == PRESETS[1]:
            mars_src, ar_src = RELEASED_MARS, RELEASED_AR
        else:
            if not (isinstance(mars_name, str) and mars_name.strip()):
                raise ValueError("MARS model: pick a listed model or type a hub id (owner/name)")
            mars_src = core.catalog.resolve(mars_name)
            ar_src = core.catalog.resolve(ar_name) if isinstance(ar_name, str) and ar_name.strip() else None
        core.store.get(mars_src, quantization, pin=preset == PRESETS[0] and quantization == core.quantization)
        if ar_src:
            core.store.get(ar_src, quantization)
        session.mars_source, session.ar_source, session.quantization = mars_src, ar_src, quantization
        core.sessions.remember(getattr(request, "session_hash", None), session)
        hooks = self.ui.model_hook_values(session) if self.ui is not None else []
        return (core.model_status(session), *hooks)

    def load_in_tab(self, preset, mars_name, ar_name, quantization, session: Session, request: gr.Request = None):
        """`load`, with its answer in the tab as the last output: Loading, then what was loaded."""
        n = 1 + len(self.ui.model_hook_outputs()) if self.ui is not None else 1
        yield (*([gr.skip()] * n), status_html("run", "Loading: a model not loaded yet may take a while…"))
        out = self.load(preset, mars_name, ar_name, quantization, session, request)
        mars, ar = self.core.models_for(session)
        yield (*out, status_html("done", f"Loaded for your session: MARS {mars.name}, AR "
                                         f"{ar.name if ar else '(none)'}, quantization {mars.quantization}."))


def add_tab(ui: UI, status: gr.Markdown) -> ModelsTab:
    """Add last: its Load button refreshes what the other tabs registered with `on_models_changed`."""
    tab = ModelsTab(ui.core, ui)
    with gr.Tab("Models", id="models"):
        gr.Markdown(f"Choose the models for **your** session (others are not affected; the API calls of "
                    f"this session follow the choice too). The released checkpoints (`{RELEASED_MARS}`, "
                    f"`{RELEASED_AR}`) need network access. Models are picked by name from this list, or "
                    "by hub id; no server path is accepted and no remote code is ever run. For the operator: "
                    "`MARS_MODEL`, `AR_MODEL` (empty: none), `MARS_QUANTIZATION`, and `MARS_MODELS_DIR` (a "
                    "folder whose model folders are listed here).")
        preset = fields.Radio(list(PRESETS), value=PRESETS[0], label="models")
        names = ui.core.catalog.names()
        hub = " or type a hub id (owner/name)" if ui.opts.allow_hub else ""
        with gr.Row():
            mars_box = fields.Dropdown(names, value=None, allow_custom_value=ui.opts.allow_hub,
                                       label=f"MARS model, for 'custom': pick one{hub}", elem_id="mars-source")
            ar_box = fields.Dropdown(names, value=None, allow_custom_value=ui.opts.allow_hub,
                                     label="AR baseline (optional)", elem_id="ar-source")
        quant = fields.Radio(list(QUANTIZATIONS), value="none",
                             label="quantization (bitsandbytes 8-bit or 4-bit weights; loads on CPU and GPU)")
        btn = gr.Button("Load", variant="primary", elem_id="load-models")
        # the answer where the visitor clicked, not only in the header
        result = gr.HTML(status_html("info", "The models of your session are named at the top of the page."),
                         elem_id="load-result", label="status")
    outputs = [status, *ui.model_hook_outputs(), result]
    armed = btn.click(lambda: queued_html("load"), None, [result], queue=False, api_visibility="private")
    # one load at a time, waiting in core.loads rather than in Gradio's queue (where waiting loads
    # would count against the generations' room: playground.job_queue); one per visitor
    inputs, n = [preset, mars_box, ar_box, quant, ui.session], len(outputs)
    loader = gated(ui.core.loads, inputs.index(ui.session), "load", tab.load_in_tab, n, n - 1)
    loading = armed.then(in_place(loader, n, n - 1), inputs, outputs, api_name="load_models",
                         show_progress_on=[result], concurrency_limit=None, concurrency_id="load")
    loading.failure(settle, [result], [result], queue=False, api_visibility="private")
    ui.tabs["models"] = tab
    return tab
