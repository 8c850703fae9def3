"""The life of a run on the page (playground.runs), without a browser: every end has its own
status kind and words, errors are yielded in place and then raised hidden, a run that never left
the queue is told apart from one that Stop removed. The browser side: test_app_browser_states.py."""
from __future__ import annotations

import gradio as gr
import pytest

import app
from app_fixtures import Tabs, demo, pair, pg, run_ui  # noqa: F401
from playground.runs import in_place, job, kind_of, queued_html, settle, status_html


def test_status_kinds_are_checked_and_read_back():
    assert kind_of(status_html("rejected", "x")) == "rejected" and kind_of("<p>plain</p>") is None
    assert "&lt;b&gt;" in status_html("error", "<b>")
    with pytest.raises(ValueError, match="status kind 'oops'"):
        status_html("oops", "x")


def test_errors_are_yielded_in_place_then_raised_hidden():
    def bad(x):
        raise ValueError(f"x must be small, got <{x}>")

    run = in_place(bad, 3, 1)
    first = next(run(7))
    assert isinstance(first[0], type(gr.skip())) and isinstance(first[2], type(gr.skip()))
    assert kind_of(first[1]) == "error" and "x must be small, got &lt;7&gt;" in first[1]
    gen = run(7)
    next(gen)
    with pytest.raises(gr.Error) as e:
        next(gen)
    # the API still gets it, as plain text (the page never draws a hidden error; its line escapes)
    assert e.value.visible is False and "x must be small, got <7>" in e.value.message

    def broken():
        return {}["missing"]

    out = next(in_place(broken, 1, 0)())
    assert "Internal error (KeyError)" in out[0] and "missing" not in out[0]  # no internals shown


def test_a_job_says_running_then_done_with_its_results():
    steps = list(job(lambda a, b: (a + b, a * b), 2, "Running: x", "Done: x")(2, 3))
    assert kind_of(steps[0][2]) == "run" and isinstance(steps[0][0], type(gr.skip()))
    assert steps[1][:2] == (5, 6) and kind_of(steps[1][2]) == "done"


def test_settle_tells_a_full_queue_from_a_stop_and_leaves_other_ends_alone():
    queued = queued_html("batch")
    assert kind_of(settle(queued)) == "rejected" and "queue is full" in settle(queued)
    assert kind_of(settle(queued, stop_pressed=True)) == "cancelled"
    for end in ("error", "done", "stopped"):  # the run reached the server: its own status stands
        assert isinstance(settle(status_html(end, "x")), type(gr.skip()))


def test_generation_ends_are_named(pg, pair):
    assert kind_of(run_ui(pg, max_new=8)[-1]["status"]) == "done"
    small = Tabs(app.build_app(*pair, max_seconds=0.0))
    last = run_ui(small, tau=1.0, max_new=200)[-1]
    assert kind_of(last["status"]) == "stopped" and "120" not in last["status"] and "0 s limit" in last["status"]


def test_after_a_run_the_final_panels_are_resent_only_after_a_stop(pg):
    from app_fixtures import OUT, PROMPT
    from playground.duel import AR_SIDES
    from playground.session import Session

    session = Session()
    pg.playground.arm(session)
    list(pg.playground.page_generate(PROMPT, 0.9, 4, "probability", 0.0, 0, 8, "sliding", AR_SIDES[0], 0, session))
    out = pg.playground.after_run(session)
    assert all(isinstance(x, type(gr.skip())) for x in out[:-2])  # ended on its own: nothing sent twice
    pg.playground.arm(session)
    gen = pg.playground.page_generate(PROMPT, 1.0, 4, "probability", 0.0, 0, 200, "sliding", AR_SIDES[0], 0, session)
    next(gen)  # running; then Gradio cancels it before Stop's handler ran
    out = dict(zip(OUT, pg.playground.after_run(session)))
    assert kind_of(out["status"]) == "stopped" and 'data-status="stopped"' in out["mars"]
    gen.close()


def test_generate_is_off_from_the_click_until_the_run_has_ended(pg):
    """A second Generate while a run plays would stream a second duel into the same panels (and
    the first one's end would switch Stop off under it): Generate is off until every kind of end."""
    from app_fixtures import PROMPT
    from playground.duel import AR_SIDES
    from playground.session import Session

    session = Session()
    stop, status, generate = pg.playground.arm(session)
    assert stop["interactive"] is True and generate["interactive"] is False and kind_of(status) == "queued"
    list(pg.playground.page_generate(PROMPT, 0.9, 4, "probability", 0.0, 0, 8, "sliding", AR_SIDES[0], 0, session))
    *_, stop, generate = pg.playground.after_run(session)  # ended on its own, or cancelled (Stop)
    assert stop["interactive"] is False and generate["interactive"] is True
    for pressed in (False, True):  # an error or a full queue; Stop on a queued run
        session.stop_pressed = pressed
        _, stop, generate = pg.playground.settle(status, session)
        assert stop["interactive"] is False and generate["interactive"] is True
