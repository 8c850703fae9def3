"""A queued run's life on the page, the same for every button that starts one (Generate, Run sweep,
Run batch, Run simulation, Load):

    click -> Queued -> Running -> Done | Stopped | Cancelled (Stop while queued)
                                | Not run (the server's queue was full) | Error (in words)

The status line under the button tells which, at the end too; Stop (where there is one) is disabled
once the run is over; each error is shown once, in place, as text. Gradio would also show an error
as a toast and a red "Error" pill over the outputs: our errors are raised hidden (an API caller
still gets them as errors; Gradio then draws neither). A run refused by a full queue gets
Gradio's toast and pills all the same: style.JS hides that toast and style.CSS the pills, because
`settle` says it in place.

Why a `.failure` listener: in Gradio 6 a `.then` runs after success or cancel but not after an
error, and a job refused by a full queue never reaches the server at all.

Long jobs and model loads wait in a bounded queue of their own (`gated`, playground.job_queue), not
in Gradio's: there they are refused (Not run, in place) when the visitor or the line is at its bound,
and say their place in line while they wait.
"""
from __future__ import annotations

import functools
import html
import inspect
import re
import traceback
from typing import Callable

import gradio as gr

from .errors import plain_message
from .job_queue import JobQueue, QueueFull

KINDS = ("info", "queued", "run", "done", "stopped", "cancelled", "rejected", "error")


def status_html(kind: str, text: str) -> str:
    """The status line of a run (kind: one of KINDS; the CSS colours errors)."""
    if kind not in KINDS:
        raise ValueError(f"status kind {kind!r}: expected one of {KINDS}")
    return f'<div class="run-status" data-kind="{kind}" role="status">{html.escape(text)}</div>'


def kind_of(status: str | None) -> str | None:
    found = re.search(r'data-kind="(\w+)"', status or "")
    return found.group(1) if found else None


def message_for(e: Exception) -> str:
    """What the visitor reads: a ValueError's own words; anything else a short "internal error"
    (its traceback goes to the server log only)."""
    if isinstance(e, gr.Error):
        return e.message
    if isinstance(e, ValueError):
        return plain_message(e)
    traceback.print_exc()
    return f"Internal error ({type(e).__name__}); the server log has the details."


def in_place(fn: Callable, n_outputs: int, status_at: int) -> Callable:
    """`fn` (a generator or not) as a generator whose failure is yielded as an error status at
    output `status_at` (other outputs untouched) and then raised hidden: no toast, and the
    event's `.failure` listeners run. A plain function's return value is yielded once. The raised
    message is plain text: the page never draws a hidden error, an API client reads it as text.
    A job the long-job queue refused (QueueFull) ends as "rejected", not as an error."""
    def failed(e: Exception):
        text = message_for(e)
        out = [gr.skip()] * n_outputs
        out[status_at] = status_html("rejected" if isinstance(e, QueueFull) else "error", text)
        return tuple(out), gr.Error(text, visible=False, print_exception=False)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            if inspect.isgeneratorfunction(fn):
                yield from fn(*args, **kwargs)
            else:
                yield fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every failure ends as text in place
            out, err = failed(e)
            yield out
            raise err from None
    return run


def job(fn: Callable, n_results: int, running: str, done: str) -> Callable:
    """A long job's handler with a status output appended: `running` as soon as it starts (the
    wait in the queue is over), then its `n_results` results with `done`."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        yield (*([gr.skip()] * n_results), status_html("run", running))
        result = fn(*args, **kwargs)
        yield (*(result if isinstance(result, tuple) else (result,)), status_html("done", done))
    return run


POLL_S = 1.0  # a waiting job yields this often: Gradio drops a cancelled or abandoned run at a yield


def gated(queue: JobQueue, owner_at: int, kind: str, fn: Callable, n_outputs: int, status_at: int) -> Callable:
    """The generator `fn`, run once `queue` gives it a slot; the owner (the visitor's Session) is
    argument `owner_at`. Refused at once with QueueFull over a bound; while it waits, its place in
    line goes to output `status_at`. The slot is given back however `fn` ends: done, failed, or
    closed by Gradio (a cancelled run, or a visitor who left: noticed at the next yield)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with queue.enter(args[owner_at], kind) as ticket:
            shown = None
            while not ticket.wait(POLL_S if shown else 0):  # the first place in line is said at once
                out = [gr.skip()] * n_outputs
                words = waiting_words(queue, ticket.ahead)
                if words != shown:  # an unchanged line is not sent again
                    out[status_at], shown = status_html("queued", words), words
                yield tuple(out)
            yield from fn(*args, **kwargs)
    return run


def waiting_words(queue: JobQueue, ahead: int) -> str:
    jobs = f"{ahead} {queue.what}{'s' if ahead != 1 else ''}"
    at_once = "one runs" if queue.slots == 1 else f"{queue.slots} run"
    return f"Queued: {jobs} ahead of yours ({at_once} at a time, for all visitors); it starts on its own…"


def queued_html(what: str = "run") -> str:
    return status_html("queued", f"Queued: waiting for a free slot before this {what} starts…")


def settle(status: str, stop_pressed: bool = False) -> str:
    """After a failure: a run whose status still says Queued never started. Either Stop removed it
    from the queue, or the server refused it because its queue was full (Gradio then sends no
    event to the server at all)."""
    if kind_of(status) != "queued":
        return gr.skip()
    if stop_pressed:
        return status_html("cancelled", "Cancelled: the queued run was removed before it started.")
    return status_html("rejected", "Not run: the server's queue is full (too many visitors waiting). "
                                   "Nothing was lost; try again in a minute.")
