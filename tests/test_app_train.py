"""The Train tab: the MARS stage run live from the bundled AR model (in a process of its own, nothing
on disk), Stop keeping what was trained, the server's time budget, fields named in every refusal,
the hand-off to the session's Playground (page and API), and the bound on trained models held."""
from __future__ import annotations

import builtins
import os
import re
import threading
import time

import gradio as gr
import pytest

from app_fixtures import PROMPT, ROOT, pair  # noqa: F401
from playground import tab_train
from playground.duel import AR_SIDES
from playground.errors import guard
from playground.session import Session
from playground.trained import TRAINED, TrainedModels
from playground.train_view import summary_text
from training.tiny_live import LiveRecipe, train_live

needs_bundled = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "assets", "models", "tiny-ar-sft")),
                                   reason="the bundled AR model is not built")
SHORT = dict(objective="paper", block_size=4, ar_weight=8.0, sft=True, lr=1e-3, steps=10)


class Request:
    def __init__(self, key):
        self.session_hash = key


def make_tab(pair, **opts):  # noqa: F811
    """The Train tab of a whole app (its hand-off refreshes every tab's components)."""
    import app

    return app.build_app(*pair, **{"train_eval_n": 2, "train_threads": 1, **opts}).tabs["train"]


def run_page(tab, session, **kw):
    args = dict(SHORT, **kw)
    return list(tab.train(*args.values(), session))


def run_in_background(tab, session, **kw) -> tuple[threading.Thread, list]:
    """The page's run in a thread of its own; the list fills with its updates as they come."""
    got = []

    def page():
        for update in tab.train(*dict(SHORT, **kw).values(), session):
            got.append(update)
    runner = threading.Thread(target=page)
    runner.start()
    return runner, got


@pytest.mark.parametrize("field,value,message", [
    ("objective", "magic", "objective must be one of gated, paper"),
    ("block_size", 99, "block size B must be between 2 and 8"),
    ("ar_weight", -1, "ar_weight must be between 0 and 32"),
    ("sft", "maybe", "SFT term must be true or false"),
    ("lr", 1.0, "learning rate must be between 0.0001 and 0.005"),
    ("steps", 100_000, "steps must be between 10 and 400"),
    ("steps", "<b>x</b>", "steps must be a whole number between 10 and 400, got '<b>x</b>'"),
])
def test_bad_values_name_the_field(pair, field, value, message):  # noqa: F811
    tab = make_tab(pair)
    with pytest.raises(gr.Error) as e:
        guard(tab.api_train)(**dict(SHORT, **{field: value}), request=Request("bad"))
    assert message in e.value.message and "Traceback" not in e.value.message


@needs_bundled
def test_a_page_run_draws_and_hands_the_model_to_the_playground(pair):  # noqa: F811
    from playground.tab_playground import PlaygroundTab

    tab = make_tab(pair)
    session = Session()
    outs = run_page(tab, session)
    progress, losses, evals, table, race, status = outs[-1]
    assert 'data-kind="done"' in status and "Finished after 10 steps" in status and race["interactive"]
    assert table.count("<tr>") == 1 + 1 + 4 and 'aria-valuenow="10"' in progress  # header, step 0, four evaluations
    assert len(losses.data) == 2 and [t.name for t in evals.data][0] == "tokens per forward, tau 0.95"
    assert any("step 5 of 10" in o[0] for o in outs if isinstance(o[0], str))  # the bar moved while it trained
    res = session.train_result
    assert res.status == "finished" and [p["step"] for p in res.curve] == list(range(1, 11))
    status_line, *hooks, done, tabs = tab.race(session, Request("page-1"))
    assert "your MARS model (paper, B = 4, 10 steps)" in status_line and tabs.selected == "playground"
    assert len(hooks) == len(tab.ui.model_hook_outputs()) and 'data-kind="done"' in done
    mars, ar = tab.core.models_for(session)
    assert session.mars_source == TRAINED and mars.trained_block_size == 4 and ar.name == "tiny-ar-sft"
    out = guard(PlaygroundTab(tab.core).api_generate)("What is the sum of [58, 64, 50, 37]?", max_new_tokens=48,
                                                      request=Request("page-1"))
    assert out["mars"]["model"].startswith("your MARS model") and out["ar"]["model"] == "tiny-ar-sft"
    assert not os.path.exists(os.path.join(ROOT, "(in memory)"))  # the stage's output folder was never made


@needs_bundled
def test_stop_keeps_what_was_trained(pair):  # noqa: F811
    tab = make_tab(pair)
    session = Session()
    runner, got = run_in_background(tab, session, steps=400)
    for _ in range(1200):
        if any(isinstance(o[0], str) and "step 3 of 400" in o[0] for o in got):
            break
        time.sleep(0.1)
    assert "Stopping" in tab.stop("", session)
    runner.join(120)
    res = session.train_result
    assert res.status == "stopped" and 3 <= res.steps < 400 and res.evals[-1]["step"] == res.steps
    assert 'data-kind="stopped"' in got[-1][-1] and "Stopped by you" in got[-1][-1]
    tab.race(session)
    assert tab.core.models_for(session)[0].name == f"your MARS model (paper, B = 4, {res.steps} steps)"


@needs_bundled
def test_the_time_budget_holds_whatever_is_asked(pair):  # noqa: F811
    tab = make_tab(pair, train_seconds=25.0)
    began = time.perf_counter()
    out = guard(tab.api_train)(**dict(SHORT, steps=400), request=Request("budget"))
    assert out["status"] == "time budget" and out["steps"] < 400 and out["seconds"] <= 25.0 + 5
    assert time.perf_counter() - began < 25.0 + 40  # the child's start-up on top, bounded
    assert out["loaded"] and out["evals"][-1]["step"] == out["steps"]


@needs_bundled
def test_api_train_returns_the_curve_and_hands_off_to_that_clients_generate(pair):  # noqa: F811
    from playground.tab_playground import PlaygroundTab

    tab = make_tab(pair)
    out = guard(tab.api_train)(objective="gated", steps=10, request=Request("client-7"))
    assert out["status"] == "finished" and len(out["curve"]) == 10 and out["recipe"]["objective"] == "gated"
    assert all(p["clean"] is None and p["noisy"] > 0 for p in out["curve"])  # gated: the clean side is the AR model
    assert out["loaded"] and out["model"] == "your MARS model (gated, B = 4, 10 steps)"
    play = PlaygroundTab(tab.core)
    mine = guard(play.api_generate)(PROMPT, max_new_tokens=24, request=Request("client-7"), tau=1.0,
                                    ar_side=AR_SIDES[0])
    assert mine["mars"]["model"] == out["model"] and mine["ar"]["model"] == "tiny-ar-sft"
    assert mine["mars"]["token_ids"] == mine["ar"]["token_ids"]  # gated: tau 1 is the AR model it started from
    other = guard(play.api_generate)(PROMPT, max_new_tokens=4, request=Request("client-8"))
    assert other["mars"]["model"] == "fixture-mars"  # another client keeps the defaults


@needs_bundled
@pytest.mark.parametrize("objective,key", [("paper", "model.embed_tokens.weight"), ("gated", "mask_embedding")])
def test_the_stage_writes_nothing_to_disk(monkeypatch, objective, key):
    real_open = builtins.open

    def no_writes(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            raise AssertionError(f"wrote {file}")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_writes)
    res = train_live(LiveRecipe(objective=objective, steps=2, evals=1, eval_n=1, batch_size=4))
    assert res.status == "finished" and res.steps == 2 and key in res.state


def test_trained_models_are_bounded_with_a_clear_message():
    held = TrainedModels(capacity=1, idle_s=3600)
    a, b = Session(), Session()
    held.put(a, "model-a")
    with pytest.raises(ValueError, match="already holds 1 visitors' trained models, its limit"):
        held.put(b, "model-b")
    held.put(a, "model-a2")  # a session replaces its own
    assert held.get(a) == "model-a2" and len(held) == 1
    held.idle_s = 0.0  # a's model idle: another visitor may take the room
    time.sleep(0.01)
    held.put(b, "model-b")
    assert held.get(a) is None and held.get(b) == "model-b"
    del b
    import gc

    gc.collect()
    assert len(held) == 0  # a session that ended takes its model with it


def test_each_objective_has_its_own_rate_on_the_page_and_the_api(pair, monkeypatch):  # noqa: F811
    from training.tiny_live import LR_FOR

    tab = make_tab(pair)
    seen = []
    monkeypatch.setattr(tab, "_job", lambda recipe: seen.append(recipe) or (_ for _ in ()).throw(ValueError("stop here")))
    for objective in ("gated", "paper"):
        with pytest.raises(gr.Error, match="stop here"):
            guard(tab.api_train)(objective=objective, steps=10, request=Request(f"lr-{objective}"))
    assert [r.lr for r in seen] == [LR_FOR["gated"], LR_FOR["paper"]] == [5e-3, 5e-4]
    assert tab_train.DEFAULT.objective == "gated" and tab_train.DEFAULT.lr == LR_FOR["gated"]


def test_the_summary_says_what_the_sft_term_protects():
    evals = [{"tpf_095": 1.0, "acc_095": 0.0, "acc_1": 0.88, "n": 16}, {"tpf_095": 1.6, "acc_095": 0.5, "acc_1": 0.4, "n": 16}]
    off = summary_text("finished", 120, 170, evals, sft=False, objective="paper")
    assert "fell by 48 points" in off and "w/o SFT loss" in off
    assert "fell by" not in summary_text("finished", 120, 170, evals, sft=True, objective="paper")
    assert "no accuracy can be lost" in summary_text("stopped", 50, 70, evals, sft=True, objective="gated")


@needs_bundled
def test_a_generation_is_served_while_a_run_trains(pair):  # noqa: F811
    """The run trains in a child process, so a visitor's generation must not wait for it: the
    generation comes back while the run is still training (at its 400 steps' pace that is minutes,
    and its budget is raised past the hang guard). Ordered, not timed: a generation that waited for
    the run would return after it, whatever the machine's speed."""
    from playground.tab_playground import PlaygroundTab

    tab = make_tab(pair, train_seconds=600.0)
    session = Session()
    runner, got = run_in_background(tab, session, steps=400)
    try:
        end = time.monotonic() + 300
        while not any(isinstance(o[0], str) and re.search(r"step [1-9]\d* of 400", o[0]) for o in list(got)):
            assert time.monotonic() < end and runner.is_alive(), "the run never reported a step"
            time.sleep(0.1)
        job = session.train_job
        out = guard(PlaygroundTab(tab.core).api_generate)(PROMPT, max_new_tokens=48, request=Request("visitor-2"))
        assert out["ar"]["stats"]["tokens"] > 0
        assert job.proc.poll() is None and session.train_job is job  # the run was still training
    finally:
        if session.train_job is not None:
            session.train_job.stop()
        runner.join(120)
    assert session.train_result.status == "stopped"


@needs_bundled
def test_a_gated_model_shared_by_threads_takes_turns():
    """Two decodes of one mask-gated model at once (a visitor's race and the "fastest" measurement in
    the background) read each other's gate unless its forwards take turns."""
    from mars_core import DecodeConfig, generate, load_model
    from mars_core.gate import attach_gate
    from playground.models import one_forward_at_a_time

    model, tok = load_model(os.path.join(ROOT, "assets", "models", "tiny-ar-sft"))
    attach_gate(model, tok.mask_token_id, 8)
    one_forward_at_a_time(model)
    errors = []

    def decode(cfg, prompt):
        try:
            for _ in range(4):
                generate(model, tok, [prompt], cfg)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(e))
    threads = [threading.Thread(target=decode, args=(DecodeConfig(mode="mars", max_new_tokens=40), "What is 2 + 3?")),
               threading.Thread(target=decode, args=(DecodeConfig(mode="lossless", draft_budget=(6, 2), prompt_lookup=2,
                                                                  max_new_tokens=60), "Convert 324 months to years."))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_stop_while_queued_cancels_and_gives_the_place_back(pair):  # noqa: F811
    """A run waiting for the one training slot: Stop removes it, and its place in the queue is free at once."""
    tab = make_tab(pair)
    jobs = tab.core.jobs
    other = jobs.enter(object(), "train")  # another visitor's run holds the slot
    session = Session()
    page = tab.page_train(*SHORT.values(), session)
    first = next(page)
    assert 'data-kind="queued"' in first[-1] and "1 long job ahead" in first[-1]
    stopped = tab.stop(first[-1], session)
    assert 'data-kind="cancelled"' in stopped and session.train_job is None
    assert list(page) == [] and jobs.counts() == (1, 0)  # ended quietly, no longer waiting
    other.release()
    assert jobs.counts() == (0, 0)
