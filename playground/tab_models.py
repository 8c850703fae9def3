"""The Models tab: which models this browser session uses (others are not affected)."""
from __future__ import annotations

import gradio as gr

from .core import Core
from .errors import guard
from .models import QUANTIZATIONS, RELEASED_AR, RELEASED_MARS
from .session import Session
from .ui import UI
from .validate import as_choice

PRESETS = ("bundled", "released (hub)", "custom")


class ModelsTab:
    def __init__(self, core: Core, ui: UI | None = None):
        self.core = core
        self.ui = ui

    def load(self, preset, mars_text, ar_text, quantization, session: Session):
        """Load the chosen pair for this session; returns the status line and, for every tab that
        registered a hook, its refreshed components."""
        core = self.core
        as_choice("preset", preset, PRESETS)
        as_choice("quantization", quantization, QUANTIZATIONS)
        if preset == PRESETS[0]:
            mars_src, ar_src = core.mars_source, core.ar_source
        elif preset == PRESETS[1]:
            mars_src, ar_src = RELEASED_MARS, RELEASED_AR
        else:
            mars_src = (mars_text or "").strip()
            ar_src = (ar_text or "").strip() or None
            if not mars_src:
                raise ValueError("give the MARS model: a local folder or a hub id (owner/name)")
        core.store.get(mars_src, quantization, pin=preset == PRESETS[0] and quantization == core.quantization)
        if ar_src:
            core.store.get(ar_src, quantization)
        session.mars_source, session.ar_source, session.quantization = mars_src, ar_src, quantization
        hooks = self.ui.model_hook_values(session) if self.ui is not None else []
        return (core.model_status(session), *hooks)


def add_tab(ui: UI, status: gr.Markdown) -> ModelsTab:
    """Add last: its Load button refreshes what the other tabs registered with `on_models_changed`."""
    tab = ModelsTab(ui.core, ui)
    with gr.Tab("Models", id="models"):
        gr.Markdown(f"Choose the models for **your** session (others are not affected). The released "
                    f"checkpoints (`{RELEASED_MARS}`, `{RELEASED_AR}`) need network access. "
                    "No remote code is ever run. Environment variables for a Space: `MARS_MODEL`, "
                    "`AR_MODEL` (empty: none), `MARS_QUANTIZATION`.")
        preset = gr.Radio(list(PRESETS), value=PRESETS[0], label="models")
        with gr.Row():
            mars_box = gr.Textbox(label="MARS model (folder or hub id, for 'custom')", elem_id="mars-source")
            ar_box = gr.Textbox(label="AR baseline (optional)", elem_id="ar-source")
        quant = gr.Radio(list(QUANTIZATIONS), value="none", label="quantization (8/4-bit need a GPU "
                         "and bitsandbytes)")
        btn = gr.Button("Load", variant="primary", elem_id="load-models")
    btn.click(guard(tab.load), [preset, mars_box, ar_box, quant, ui.session], [status, *ui.model_hook_outputs()],
              api_name="load_models", concurrency_limit=1, concurrency_id="load")
    ui.tabs["models"] = tab
    return tab
