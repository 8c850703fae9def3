"""The How it works tab: the training mask (from `mars_training_mask`) and the sliding-window
forwards of the session's last generation."""
from __future__ import annotations

import gradio as gr

from mars_core import mars_training_mask

from . import plots
from .errors import guard
from .session import Session
from .ui import UI
from .validate import as_int


MASK_N, MASK_B = (2, 32), (1, 16)  # the sliders' ranges, and the API's


class HowTab:
    def mask_plot(self, n, block_size):
        n = as_int("n", n, *MASK_N)
        block_size = as_int("B", block_size, *MASK_B)
        return plots.mask_figure(n, block_size)

    def mask_api(self, n: int = 8, block_size: int = 4) -> list:
        """The MARS training mask (2n x 2n, 1 = may attend) for the layout [noisy | clean]."""
        n = as_int("n", n, *MASK_N)
        block_size = as_int("block_size", block_size, *MASK_B)
        return mars_training_mask(n, block_size).int().tolist()

    def window_plot(self, session: Session):
        return plots.window_figure(session.last_accepted if session else [], session.last_block if session else 4)


def add_tab(ui: UI) -> HowTab:
    tab = HowTab()
    with gr.Tab("How it works", id="how"):
        gr.Markdown("**Training mask.** The sequence is fed as `[noisy | clean]`: the noisy copy has every "
                    "response token replaced by `[MASK]`. Clean tokens see clean tokens causally; a noisy "
                    "token sees the earlier noisy tokens of its own block and every clean token of earlier "
                    "blocks. Computed by `mars_training_mask` itself.")
        with gr.Row():
            m_n = gr.Slider(*MASK_N, value=8, step=1, label="n (tokens)")
            m_b = gr.Slider(*MASK_B, value=4, step=1, label="B (block size)")
        mask_plot = gr.Plot(plots.mask_figure(8, 4), elem_id="mask-plot", label="training mask")
        gr.Markdown("**Inference.** Each forward appends `B` masks after the prefix and accepts predictions "
                    "left to right while confident. Below: the forwards of your last MARS generation.")
        w_btn = gr.Button("Show my last generation", elem_id="window-show")
        window_plot = gr.Plot(plots.window_figure([], ui.core.default_block), elem_id="window-plot",
                              label="sliding window")
        ui.api(guard(tab.mask_api), "mask", "mask")
    for c in (m_n, m_b):
        c.change(guard(tab.mask_plot, page=True), [m_n, m_b], [mask_plot], api_visibility="private", queue=False)
    # also the /window endpoint, but its failure is drawn on the page first: escaped (it echoes no input)
    w_btn.click(guard(tab.window_plot, page=True), [ui.session], [window_plot], api_name="window", queue=False)
    ui.tabs["how"] = tab
    return tab
