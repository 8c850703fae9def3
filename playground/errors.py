"""How a handler's failure reaches the user: a ValueError becomes its message (server paths
scrubbed, cut to a readable length), anything else a short "internal error" with the traceback in
the server log only.

Plain text for API clients, escaped for the page: Gradio draws a visible error as a toast whose
message it renders as (sanitised) HTML, so a page event's message is escaped to show markup as
text; an API client reads the message as text, where `&lt;` would be a wrong character. So an
API endpoint is `guard(fn)`, a page event `guard(fn, page=True)`."""
from __future__ import annotations

import contextlib
import functools
import html
import inspect
import traceback

import gradio as gr

from .models import scrub

MAX_MESSAGE = 300  # characters: a message never echoes a long input back


def plain_message(e: Exception) -> str:
    """What the user reads for a ValueError: no server paths, no 5,000-character echo."""
    text = scrub(str(e))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 1] + "…"


def user_message(e: Exception, page: bool = False) -> str:
    """`plain_message`, escaped for the page (Gradio renders error toasts as HTML)."""
    return html.escape(plain_message(e), quote=False) if page else plain_message(e)


@contextlib.contextmanager
def as_user_errors(page: bool = False):
    try:
        yield
    except gr.Error:
        raise
    except ValueError as e:
        raise gr.Error(user_message(e, page), print_exception=False) from None
    except Exception as e:  # noqa: BLE001 - the user gets a short message, the log the traceback
        traceback.print_exc()
        raise gr.Error(f"internal error ({type(e).__name__})", print_exception=False) from None


def guard(fn, page: bool = False):
    """`fn` with its errors turned into user messages (see `as_user_errors`): plain text for an
    API endpoint, escaped (`page=True`) for an event whose error the page shows as a toast.
    Gradio streams a generator function, so a generator stays a generator."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapped_gen(*args, **kwargs):
            with as_user_errors(page):
                yield from fn(*args, **kwargs)
        return wrapped_gen

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with as_user_errors(page):
            return fn(*args, **kwargs)
    return wrapped
