"""The playground tab's handlers called directly, as Gradio calls them (the other tabs:
test_app_tabs.py; the API through gradio_client: test_app_api.py; the browser: test_app_browser.py)."""
from __future__ import annotations

import html
import json
import re

import gradio as gr
import pytest
import torch

import app
from app_fixtures import OUT, PROMPT, ROOT, Tabs, demo, figure, pair, pg, run_ui, spans  # noqa: F401
from mars_core.acceptance import passes
from playground import render
from playground.duel import AR_SIDES, Step
from playground.errors import guard
from playground.replay import decisions
from playground.runs import status_html
from playground.session import Session

PUBLIC = {"generate", "generate_stream", "frontier", "batch", "under_load", "mask", "window", "load_models", "train",
          "train_stream"}


def test_build_named_public_endpoints_and_queue_limits(demo):
    info = demo.get_api_info()
    assert {n.strip("/") for n in info["named_endpoints"]} == PUBLIC  # no /Session, no other no-op
    assert not info.get("unnamed_endpoints")
    for name, ep in info["named_endpoints"].items():
        labels = [r.get("label") for r in ep["returns"]]
        assert all(lab and not re.fullmatch(r"\d+(st|nd|rd|th)|value_\d+", lab) for lab in labels), (name, labels)
    assert demo._queue.max_size == 16
    gen = next(d for d in demo.fns.values() if d.api_name == "generate_stream")
    assert gen.concurrency_limit == 2
    cfg = json.dumps(demo.get_config_file(), default=str)
    assert "fixture-mars" in cfg and ROOT not in cfg and "/tmp/" not in cfg  # names, never server paths


def test_limits_come_from_the_model_context(pg):
    assert pg.core.context() == 512
    assert pg.core.max_new_cap() == 256  # half the context: the default (256) fits every example
    with pytest.raises(gr.Error) as e:
        run_ui(pg, max_new=257)
    assert "max new tokens must be between 1 and 256" in e.value.message


def test_generate_streams_both_panels(pg):
    outs = run_ui(pg, tau=0.5, max_new=30)
    assert len(outs) >= 2
    last = outs[-1]
    assert 'data-status="limit"' in last["ar"] and "stopped at the token limit" in last["mars"]
    assert "token limit (30 tokens)" in last["status"]
    ar_spans, mars_spans = spans(last["ar"]), spans(last["mars"])
    assert sum(n for _, n in ar_spans) == 30 and all(n == 1 for _, n in ar_spans)
    assert sum(n for _, n in mars_spans) == 30 and len(mars_spans) < 30  # several tokens per forward
    assert 'data-tip="forward 1:' in last["mars"] and "confidence" in last["mars"] and "legend" in last["mars"]
    for key in ("forwards", "tokens/forward", "tokens/s", "compute", "elapsed"):
        assert key in last["mars"]
    assert 'class="bar"' in last["steps"] and "data-agree" in last["compare"]
    assert "fixture-ar" in last["ar"] and "fixture-mars" in last["mars"]


def test_panels_and_speed_gauge_show_the_same_figures_at_every_update(pg):
    outs = run_ui(pg, tau=0.5, max_new=60)
    assert len(outs) >= 3
    for o in outs:
        mars_tps, ar_tps = figure(o["mars"], "tps"), figure(o["ar"], "tps")
        assert figure(o["speed"], "mars-tps") == pytest.approx(mars_tps, abs=0.051)
        assert figure(o["speed"], "ar-tps") == pytest.approx(ar_tps, abs=0.051)
        assert figure(o["mars"], "compute") <= figure(o["mars"], "elapsed") + 0.006


def test_slow_motion_is_applied_to_both_sides_and_left_out_of_tokens_per_second(pg):
    last = run_ui(pg, tau=0.0, max_new=12, slow_ms=100)[-1]  # AR: 12 forwards, MARS: 3
    # the page shows seconds to 2 decimals, and 3 * 0.1 is 0.30000000000000004 in floats
    assert figure(last["ar"], "elapsed") >= 1.2 - 0.005 and figure(last["mars"], "elapsed") >= 0.3 - 0.005
    assert figure(last["ar"], "elapsed") > figure(last["mars"], "elapsed")  # one timeline: MARS ends first
    for side in ("ar", "mars"):
        compute = figure(last[side], "compute")
        assert compute < figure(last[side], "elapsed")
        seconds_behind_tps = figure(last[side], "tokens") / figure(last[side], "tps")
        assert seconds_behind_tps == pytest.approx(compute, abs=0.006)  # tokens/s is over compute time


def test_tau_one_on_the_mars_model_agrees_with_ar(pg):
    last = run_ui(pg, tau=1.0, ar_side=AR_SIDES[1], max_new=25)[-1]
    assert 'data-agree="1"' in last["compare"]
    assert all(n == 1 for _, n in spans(last["mars"]))
    assert "(1 token/step)" in last["ar"]


def test_live_tau_changes_the_same_generation(pg):
    session = Session()
    gen = pg.playground.page_generate(PROMPT, 1.0, 4, "probability", 0.0, 0, 120, "sliding", AR_SIDES[1], 0,
                                        session)
    first = next(gen)
    assert session.mars_control is not None and session.mars_control.tau == 1.0
    pg.playground.set_tau(0.0, "probability", Session())  # another session's slider: no effect
    assert session.mars_control.tau == 1.0
    pg.playground.set_tau(0.0, "probability", session)
    assert session.mars_control.tau == 0.0
    outs = [first] + list(gen)
    acc = session.last_accepted
    assert acc[0] == 1 and acc[-2] == 4 and max(acc) == 4
    assert session.mars_control is None and session.duel is None  # released when done
    assert 'data-n="4"' in outs[-1][OUT.index("mars")]


def test_stop_ends_a_running_generation_and_cancels_a_queued_one(pg):
    session = Session()
    queued = pg.playground.arm(session)[1]
    out = pg.playground.stop(queued, session)  # nothing running yet: the queued job is cancelled (by Gradio)
    assert "Cancelled" in out[0] and 'data-kind="cancelled"' in out[0] and out[-1]["interactive"] is False
    # Gradio then runs the failure listener: still "Cancelled", never "queue is full"
    assert pg.playground.settle(queued, session)[0].count("Cancelled") == 1
    late = pg.playground.stop(status_html("done", "Done"), session)  # after the run ended on its own
    assert all(isinstance(x, type(gr.skip())) for x in late[:-1]) and late[-1]["interactive"] is False
    gen = pg.playground.page_generate(PROMPT, 1.0, 4, "probability", 0.0, 0, 200, "sliding", AR_SIDES[0], 0,
                                        session)
    next(gen)
    out = dict(zip(OUT, pg.playground.stop(status_html("run", "Running"), session)))
    assert 'data-status="stopped"' in out["ar"] and 'data-status="stopped"' in out["mars"]
    assert "Stopped" in out["status"] and sum(n for _, n in spans(out["mars"])) < 200
    assert session.duel is None and session.last_mars is not None
    gen.close()


def test_time_limit_stops_long_jobs(pair):
    small = Tabs(app.build_app(*pair, max_seconds=0.0))
    last = run_ui(small, tau=1.0, max_new=200)[-1]
    assert "s limit" in last["mars"]
    assert sum(n for _, n in spans(last["mars"])) < 200


@pytest.mark.parametrize("metric,cache", [("entropy", "none"), ("margin", "block"), ("probability", "cursor")])
def test_metrics_and_caches(pg, metric, cache):
    tau = 0.3 if metric == "entropy" else 0.5
    last = run_ui(pg, tau=tau, metric=metric, cache=cache, max_new=16, temperature=0.7, seed=3)[-1]
    assert 'data-status="limit"' in last["mars"] and 'data-steps="' in last["replay"]


def test_replay_shows_every_prediction_with_its_decision(pg):
    session = Session()
    last = run_ui(pg, session=session, tau=0.6, max_new=40)[-1]
    side = session.last_mars
    n = len(side.steps)
    assert last["replay_step"]["maximum"] == n and last["replay_step"]["interactive"]
    assert sum(s.accepted for s in side.steps) == 40
    rejected_seen = False
    for k in range(1, n + 1):
        view = pg.playground.replay(k, session)
        step = side.steps[k - 1]
        marks = re.findall(r'data-mark="(\w+)"', view)
        assert len(marks) == 4 and marks[:step.accepted] == ["accepted"] * step.accepted
        assert f"Forward {k} of {n}" in view and view.count("[MASK]") == 3
        rejected_seen |= "rejected" in marks
        for tid, c in zip(step.proposed, step.confidences):
            assert f"{c:.3f}" in view
    assert rejected_seen
    # the "In:" line of forward k is the text of the forwards before it
    k = 5
    before = side.loaded.tokenizer.decode(side.track.ids[:side.steps[k - 1].start], skip_special_tokens=True)
    assert html.escape(before[-20:]) in pg.playground.replay(k, session)
    up, view = pg.playground.replay_move(n, 1, session)
    assert up["value"] == n and f"Forward {n} of {n}" in view  # clamped at the end
    assert "Generate something first" in pg.playground.replay(1, Session())


@pytest.mark.parametrize("metric,tau,confs,accepted,finished,expect", [
    ("probability", 0.9, [0.5, 0.3, 0.99, 0.2], 1, False, ["accepted", "rejected", "rejected", "rejected"]),
    ("probability", 0.9, [0.99, 0.95, 0.5, 0.99], 2, False, ["accepted", "accepted", "rejected", "rejected"]),
    ("probability", 0.9, [0.99, 0.95, 0.99, 0.99], 2, True, ["accepted", "accepted", "end", "rejected"]),
    ("entropy", 0.5, [0.1, 0.2, 0.9, 0.1], 2, False, ["accepted", "accepted", "rejected", "rejected"]),
])
def test_decisions_follow_the_acceptance_rule(metric, tau, confs, accepted, finished, expect):
    step = Step(0, [1, 2, 3, 4], confs, accepted, tau, finished)
    got = decisions(step, metric)
    assert [m for m, _ in got] == expect
    ok = passes(torch.tensor(confs), tau, metric).tolist()
    for (mark, why), good in zip(got, ok):
        if mark == "rejected" and "not confident" in why:
            assert not good
    if not ok[0]:
        assert "always taken" in got[0][1]


def test_the_replay_names_the_repeat_guard():
    step = Step(0, [5, 7, 7, 9], [0.99, 0.97, 0.98, 0.99], 2, 0.9, False)  # mask 2 repeats mask 1: refused
    got = decisions(step, "probability", repeat_guard=True)
    assert [m for m, _ in got] == ["accepted", "accepted", "rejected", "rejected"]
    assert "repeat guard" in got[2][1] and "not confident" not in got[2][1]
    assert "not confident" in decisions(Step(0, [5, 7, 8, 9], [0.99, 0.97, 0.5, 0.99], 2, 0.9, False),
                                        "probability", repeat_guard=True)[2][1]


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(prompt="a lone \ud800 surrogate"), "not valid Unicode text"),
    (dict(prompt="word " * 700), "the limit is 2,048"),
    (dict(prompt="word " * 400), "a prompt may have at most"),
    (dict(max_new=10_000), "max new tokens must be between 1 and 256"),
    (dict(tau=1.5), "tau for the probability metric must be in [0, 1]"),
    (dict(tau=float("nan")), "tau must be a finite number"),
    (dict(block=0), "block size must be between"),
    (dict(block=2.5), "block size must be a whole number"),
    (dict(metric="bogus"), "unknown metric 'bogus'"),
    (dict(cache="bogus"), "unknown cache mode 'bogus'"),
    (dict(temperature=-1), "temperature must be between"),
    (dict(seed=-3), "seed must be between"),
    (dict(ar_side="bogus"), "ar_side must be one of"),
    (dict(slow_ms=10_000), "slow motion (ms per forward) must be between 0 and 500"),
])
def test_bad_input_is_a_clear_error_next_to_the_panels(pg, kwargs, message):
    session = Session()
    gen = pg.playground.page_generate(*[kwargs.get(k, v) for k, v in (
        ("prompt", PROMPT), ("tau", 0.9), ("block", 4), ("metric", "probability"), ("temperature", 0.0),
        ("seed", 0), ("max_new", 40), ("cache", "sliding"), ("ar_side", AR_SIDES[0]), ("slow_ms", 0))], session)
    first = next(gen)
    assert 'data-kind="error"' in first[0] and message in html.unescape(first[0])
    with pytest.raises(gr.Error) as e:
        next(gen)
    assert message in html.unescape(e.value.message) and "Traceback" not in e.value.message


def test_markup_in_input_comes_back_as_text(pg):
    """On the page, escaped (the status line; a toast, which Gradio renders as HTML); to an API
    client, the same words as plain text (`&lt;` would be a wrong character there)."""
    payload = '<img src=x onerror="alert(1)"><b>bold</b>'
    gen = pg.playground.page_generate(PROMPT, 0.9, 4, payload, 0.0, 0, 40, "sliding", AR_SIDES[0], 0, Session())
    status = next(gen)[0]
    assert "<img" not in status and "&lt;img" in status
    with pytest.raises(gr.Error) as e:
        next(gen)
    assert e.value.visible is False and "unknown metric '<img src=x" in e.value.message  # hidden: for the API
    assert len(e.value.message) < 300

    def bad(value):
        raise ValueError(f"unknown thing {value!r}")

    for page, wanted in ((True, "unknown thing '&lt;b&gt;'"), (False, "unknown thing '<b>'")):
        with pytest.raises(gr.Error) as e:
            guard(bad, page=page)("<b>")
        assert e.value.message == wanted
    with pytest.raises(gr.Error) as e:
        run_ui(pg, tau="x" * 5000)
    assert len(e.value.message) < 300  # no 5,000-character echo


def test_prompt_info_counts_tokens_against_the_context(pg):
    info = pg.playground.prompt_info(PROMPT, 40, 4, Session())
    assert re.search(r"Prompt: \d+ of 468 tokens", info) and 'data-kind="info"' in info
    assert 'data-kind="error"' in pg.playground.prompt_info("word " * 400, 256, 4, Session())


def test_api_generate_returns_texts_steps_and_stats(pg):
    out = guard(pg.playground.api_generate)(PROMPT, tau=0.5, block_size=4, max_new_tokens=20)
    for side in ("ar", "mars"):
        s = out[side]
        assert isinstance(s["text"], str) and sum(s["accepted_per_step"]) == 20
        assert s["stats"]["tokens"] == 20 and s["stats"]["forwards"] == len(s["accepted_per_step"])
    assert out["mars"]["stats"]["tokens_per_forward"] > 1
    assert isinstance(out["agree"], bool) and out["speedup"] > 0
    with pytest.raises(gr.Error):
        guard(pg.playground.api_generate)("", tau=0.5)


def test_scope_text_says_what_the_model_is(demo, pair, tmp_path):
    from playground.models import Loaded
    from playground.scope import scope_html

    cfg = json.dumps(demo.get_config_file(), default=str)
    assert "About this model" in cfg and "fixture-mars" in cfg
    mars = demo.core.mars
    assert "does not record its training data" in scope_html(mars, demo.core.ar)
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "training_config.json").write_text(json.dumps({"args": {"data": "synthetic"}}))
    synthetic = Loaded(mars.model, mars.tokenizer, str(folder), "none", "tiny")
    text = scope_html(synthetic, None)
    for word in ("arithmetic", "unit conversion", "lists", "nonsense by design", "M-parameter", "held-out"):
        assert word in text


def test_render_handles_split_characters():
    from conftest import make_tokenizer

    tok = make_tokenizer()
    ids = tok("é ü 😀", add_special_tokens=False)["input_ids"]
    track = render.TokenTrack(tok, 4)
    for i, t in enumerate(ids):
        track.add(i, [t], [0.5], 0.9)
    text = "".join(re.sub(r"<[^>]+>", "", s) for s in track.spans).replace("&#8203;", "")
    assert html.unescape(text) == "é ü 😀" == track.text
    assert render.first_difference("abc", "abd") == 2 and render.first_difference("a", "a") is None


def test_words_wrap_whole_in_the_panels():
    """A token text wraps between words (a phone line once split "apples" as "app|les"); only a
    string longer than the line may break anywhere."""
    import re

    from playground import style

    rule = re.search(r"\.mars-panel \.text \{([^}]*)\}", style.CSS).group(1)
    assert "overflow-wrap: anywhere" in rule and "break-all" not in rule


def test_the_gauge_gives_the_compute_and_the_race_ratio():
    """Compute time: 100 tokens in 1 s (AR) and 0.5 s (MARS) = 2x; elapsed (the race on screen,
    slow motion included): 4 s and 1 s = 4x."""
    import re

    from playground.render import counters, speed_html

    page = speed_html(counters(100, 100, 1.0, elapsed=4.0), counters(25, 100, 0.5, elapsed=1.0))
    got = dict(re.findall(r'data-k="(speedup|race)"><b>([\d.]+)x</b>', page))
    assert got == {"speedup": "2.00", "race": "4.00"}
    assert 'data-k="race">–' in speed_html(None, None)


@pytest.mark.parametrize("tau_max,ticks", [(1.0, ["0", "0.5", "1"]), (4.0, ["0", "2", "4"])])
def test_steps_chart_draws_bars_and_tau_on_their_own_scales(tau_max, ticks):
    """Bars: accepted / B of the plot's height; the tau line: tau / tau_max of the same height,
    read on its own right-hand axis (not the bars' 0..B one)."""
    chart = render.steps_chart_html([4, 2, 1], [0.5 * tau_max, 0.25 * tau_max, tau_max], 4, tau_max)
    span, bottom = 130 - 18 - 10, 130 - 18  # the chart's drawing height and baseline
    heights = [float(h) for h in re.findall(r'class="bar" data-n="\d+" x="[\d.]+" y="[\d.]+" width="[\d.]+" '
                                            r'height="([\d.]+)"', chart)]
    assert heights == pytest.approx([span, span / 2, span / 4], abs=0.01)
    ys = [float(p.split(",")[1]) for p in re.search(r'<polyline points="([^"]+)"', chart).group(1).split()]
    assert ys == pytest.approx([bottom - span / 2, bottom - span / 4, bottom - span], abs=0.01)
    assert re.findall(r'class="tau-tick"[^>]*>([^<]+)<', chart) == ticks
    assert f"right axis 0-{tau_max:g}" in chart
