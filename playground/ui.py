"""What a tab needs to plug itself into the app.

A tab is a module with `add_tab(ui) -> handlers`: inside the app's `gr.Tabs()` it builds its
components and wires its events, using the shared pieces below. app.py calls it in one line.
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from .core import Core
from .runs import gated, in_place, job, queued_html, settle, status_html
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
        self.tabs_box: gr.Tabs | None = None  # the page's tabs (a handler may open another tab)
        self._load_hooks: list[tuple[list, Callable[[Session], object]]] = []

    @property
    def decode_limit(self) -> dict:
        """Concurrency of the Playground's generations (page and API): slots no long job can take."""
        return dict(concurrency_limit=self.opts.concurrency_limit, concurrency_id="decode")

    def job_note(self) -> gr.Markdown:
        """The bounds a long-job tab shows its visitor."""
        o = self.opts
        return gr.Markdown(f"<span class=\"muted\">Frontier, Batch and Under load runs share one queue of their "
                           f"own: {'one runs' if o.job_concurrency == 1 else f'{o.job_concurrency} run'} at a time "
                           f"for all visitors, up to {o.job_queue} wait, and each visitor may have "
                           f"{o.jobs_per_session} queued or running. Playground generations never wait for "
                           "them; yours may wait for another visitor's run to finish.</span>")

    @property
    def job_limit(self) -> dict:
        """Gradio's side of a long job (Frontier sweep, Batch, Under load): no limit, so that it
        leaves Gradio's queue at once and waits in `core.jobs` (playground.job_queue) instead.
        Gradio's `max_size` counts the waiting events of every concurrency id together: one
        visitor's queued sweeps there would get everyone's generations refused."""
        return dict(concurrency_limit=None, concurrency_id="jobs")

    def job_status(self, elem_id: str, idle: str) -> gr.HTML:
        """The status line under a long job's button (see playground.runs)."""
        return gr.HTML(status_html("info", idle), elem_id=elem_id, label="status")

    def run_job(self, btn: gr.Button, fn, inputs: list, outputs: list, status: gr.HTML, what: str,
                api_name: str, kind: str = "job"):
        """Wire a long job's button: Queued at the click (then its place in line), Running once it
        has a slot, then Done, Not run (a bound of the long-job queue) or its error, in words, in
        `status`. `inputs` must hold the session (the visitor, for the bound per visitor); `kind`
        "train" runs one at a time server-wide. Its API endpoint returns `outputs` and the status
        line, last."""
        n = len(outputs)
        owner_at = next(i for i, c in enumerate(inputs) if c is self.session)
        armed = btn.click(lambda: queued_html(what), None, [status], queue=False, api_visibility="private")
        work = job(self.gpu(fn), n, f"Running: the {what} has started…", f"Done: the {what} finished; its results "
                   "are below.")
        handler = in_place(gated(self.core.jobs, owner_at, kind, work, n + 1, n), n + 1, n)
        running = armed.then(handler, inputs, [*outputs, status], api_name=api_name, show_progress_on=outputs,
                             **self.job_limit)
        running.failure(settle, [status], [status], queue=False, api_visibility="private")
        return running

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

    def on_page_load(self, outputs: list, fn: Callable[[Session], object]) -> None:
        """When a page opens, `fn(session)` gives fresh values for `outputs` (where the page-load event
        of the real pair does not already refresh them through `on_models_changed`)."""
        self._load_hooks.append((list(outputs), fn))

    def page_load_outputs(self) -> list:
        return [c for outs, _ in self._load_hooks for c in outs]

    def page_load_values(self, session: Session) -> list:
        values = []
        for outs, fn in self._load_hooks:
            got = fn(session)
            values.extend(got if isinstance(got, (tuple, list)) else [got])
        return values

    def model_hook_outputs(self) -> list:
        return [c for outs, _ in self._model_hooks for c in outs]

    def model_hook_values(self, session: Session) -> list:
        values = []
        for outs, fn in self._model_hooks:
            got = fn(session)
            values.extend(got if isinstance(got, (tuple, list)) else [got])
        return values
