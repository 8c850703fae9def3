"""What a tab needs to plug itself into the app.

A tab is a module with `add_tab(ui) -> handlers`: inside the app's `gr.Tabs()` it builds its
components and wires its events, using the shared pieces below. app.py calls it in one line.
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from .core import Core
from .runs import in_place, job, queued_html, settle, status_html
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
        """Concurrency of the Playground's generations (page and API): slots no long job can take."""
        return dict(concurrency_limit=self.opts.concurrency_limit, concurrency_id="decode")

    def job_note(self) -> gr.Markdown:
        """The bound a long-job tab shows its visitor."""
        n = self.opts.job_concurrency
        return gr.Markdown(f"<span class=\"muted\">Frontier, Batch and Under load runs share one queue: "
                           f"{'one runs' if n == 1 else f'{n} run'} at a time, for all visitors, so that "
                           "Playground generations never wait for them. Yours may wait for another visitor's "
                           "run to finish.</span>")

    @property
    def job_limit(self) -> dict:
        """Concurrency of the long jobs (Frontier sweep, Batch, Under load): a queue of their own
        with `job_concurrency` slots (1: one job at a time for all visitors), so that one visitor's
        jobs never hold the slots a generation needs."""
        return dict(concurrency_limit=self.opts.job_concurrency, concurrency_id="jobs")

    def job_status(self, elem_id: str, idle: str) -> gr.HTML:
        """The status line under a long job's button (see playground.runs)."""
        return gr.HTML(status_html("info", idle), elem_id=elem_id, label="status")

    def run_job(self, btn: gr.Button, fn, inputs: list, outputs: list, status: gr.HTML, what: str,
                api_name: str):
        """Wire a long job's button: Queued at the click, Running once it leaves the queue, then
        Done, Not run (queue full) or its error, in words, in `status`; the job runs in the jobs
        queue (`job_limit`). Its API endpoint returns `outputs` and the status line, last."""
        n = len(outputs)
        armed = btn.click(lambda: queued_html(what), None, [status], queue=False, api_visibility="private")
        handler = in_place(job(self.gpu(fn), n, f"Running: the {what} has started…",
                               f"Done: the {what} finished; its results are below."), n + 1, n)
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

    def model_hook_outputs(self) -> list:
        return [c for outs, _ in self._model_hooks for c in outs]

    def model_hook_values(self, session: Session) -> list:
        values = []
        for outs, fn in self._model_hooks:
            got = fn(session)
            values.extend(got if isinstance(got, (tuple, list)) else [got])
        return values
