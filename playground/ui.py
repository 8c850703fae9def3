"""What a tab needs to plug itself into the app.

A tab is a module with `add_tab(ui) -> handlers`: inside the app's `gr.Tabs()` it builds its
components and wires its events, using the shared pieces below. app.py calls it in one line.
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from .core import Core
from .session import Session


class UI:
    """The shared pieces of the page: the core (models, limits), the per-session state, the
    model status line, the registered tabs and the hooks run when a session changes models."""

    def __init__(self, core: Core):
        self.core = core
        self.opts = core.opts
        self.session = gr.State(Session())
        self.tabs: dict[str, object] = {}
        self.gpu = lambda fn: fn  # app.py sets spaces.GPU on a Space: wraps every decoding handler
        self._model_hooks: list[tuple[list, Callable[[Session], tuple]]] = []

    @property
    def decode_limit(self) -> dict:
        """Concurrency for every decoding event: all tabs share one limit."""
        return dict(concurrency_limit=self.opts.concurrency_limit, concurrency_id="decode")

    def api(self, fn, api_name: str, output: str, **kwargs) -> None:
        """`gr.api` with its output named (Gradio names them "1st", "2nd"… on the API page)."""
        gr.api(fn, api_name=api_name, **kwargs)
        from gradio.context import get_blocks_context

        for block_fn in get_blocks_context().fns.values():
            if block_fn.api_name == api_name:
                for out in block_fn.outputs:
                    out.label = output

    def on_models_changed(self, outputs: list, fn: Callable[[Session], tuple]) -> None:
        """After a session loads other models, `fn(session)` gives new values for `outputs`."""
        self._model_hooks.append((list(outputs), fn))

    def model_hook_outputs(self) -> list:
        return [c for outs, _ in self._model_hooks for c in outs]

    def model_hook_values(self, session: Session) -> list:
        values = []
        for outs, fn in self._model_hooks:
            got = fn(session)
            values.extend(got if isinstance(got, (tuple, list)) else [got])
        return values
