"""How a handler's failure reaches the user: a ValueError becomes its message (HTML-escaped, server
paths scrubbed, cut to a readable length), anything else a short "internal error" with the
traceback in the server log only."""
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


def user_message(e: Exception) -> str:
    """`plain_message`, escaped: Gradio renders error toasts as HTML."""
    return html.escape(plain_message(e), quote=False)


@contextlib.contextmanager
def as_user_errors():
    try:
        yield
    except gr.Error:
        raise
    except ValueError as e:
        raise gr.Error(user_message(e), print_exception=False) from None
    except Exception as e:  # noqa: BLE001 - the user gets a short message, the log the traceback
        traceback.print_exc()
        raise gr.Error(f"internal error ({type(e).__name__})", print_exception=False) from None


def guard(fn):
    """`fn` with its errors turned into user messages (see `as_user_errors`). Gradio streams a
    generator function, so a generator stays a generator."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapped_gen(*args, **kwargs):
            with as_user_errors():
                yield from fn(*args, **kwargs)
        return wrapped_gen

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with as_user_errors():
            return fn(*args, **kwargs)
    return wrapped
