"""The Under load tab's handler, called directly on the tiny fixture models."""
from __future__ import annotations

import gradio as gr
import pytest
import torch

import app
from app_fixtures import pair  # noqa: F401
from playground.errors import guard
from playground.session import Session


@pytest.fixture(scope="module")
def tab(pair):  # noqa: F811
    torch.set_num_threads(1)
    demo = app.build_app(*pair, max_seconds=40, max_new_tokens_cap=12)
    return demo.tabs["under_load"]


def test_run_compares_the_chosen_policy_with_both_fixed_ends(tab):
    calls = []
    timeline, front, note = guard(tab.run)("bursty", 6, 3, "adaptive", True, 1.0, 2, Session(),
                                           progress=lambda *a, **k: calls.append(a))
    policies = ["adaptive", "fixed 1", "fixed 0.7"]
    assert [tr.name for tr in front.data] == policies
    assert len(timeline.data) == 3 * len(policies)  # latency, queue, tau per policy
    assert calls and all(0 <= c[0] <= 1 for c in calls)
    assert "What this run shows" in note and "| policy | p95 latency |" in note
    for p in policies:
        assert f"**{p}** m" in note
    taus = [tr for tr in timeline.data if tr.name == "fixed 0.7" and tr.line.shape == "hv"][0].y
    assert set(taus) == {0.7}


def test_one_policy_without_comparison(tab):
    timeline, front, note = guard(tab.run)("steady", 4, 3, "fixed 0.95", False, 2.0, 1, Session(),
                                           progress=lambda *a, **k: None)
    assert [tr.name for tr in front.data] == ["fixed 0.95"] and "fixed 1" not in note


@pytest.mark.parametrize("args,message", [
    (("spiky", 6, 3, "adaptive", True, 1.0, 2), "pattern must be one of bursty, steady"),
    (("bursty", 0, 3, "adaptive", True, 1.0, 2), "rate must be between 0.5 and 20"),
    (("bursty", -1, 3, "adaptive", True, 1.0, 2), "rate must be between"),
    (("bursty", 6, 999, "adaptive", True, 1.0, 2), "duration must be between 3 and 30"),
    (("bursty", 6, 3, "turbo", True, 1.0, 2), "policy must be one of"),
    (("bursty", 6, 3, "adaptive", True, float("nan"), 2), "latency target must be between"),
    (("bursty", 6, 3, "adaptive", True, 1.0, 99), "slots must be between 1 and 8"),
])
def test_bad_input_gets_a_message(tab, args, message):
    with pytest.raises(gr.Error) as e:
        guard(tab.run)(*args, Session(), progress=lambda *a, **k: None)
    assert message in e.value.message


def test_the_summary_says_when_no_policy_can_meet_the_target():
    from playground.tab_under_load import summary

    def run(policy, p95, meets):
        return {"policy": policy, "p95_latency": p95, "meets_target": meets, "accuracy": 0.8, "mean_tau": 0.9,
                "tokens_per_forward": 2.0, "unfinished": 0, "requests": 50}

    missed = summary({"settings": {"target": 1.0}, "results": [run("adaptive", 3.0, False), run("fixed 0.7", 2.0, False)]})
    assert "No policy met the target at this rate" in missed and "Lower the rate" in missed
    met = summary({"settings": {"target": 1.0}, "results": [run("adaptive", 0.5, True), run("fixed 1", 2.0, False)]})
    assert "No policy met" not in met and "**adaptive** meets the target" in met and "Every policy" not in met
    settings = {"target": 1.0, "rate": 10.0}
    missed = summary({"settings": settings, "results": [run("adaptive", 3.0, False), run("fixed 1", 4.0, False)]})
    assert "try 5 requests/s" in missed
    easy = summary({"settings": settings, "results": [run("adaptive", 0.3, True), run("fixed 1", 0.5, True)]})
    assert "Every policy met the target, tau = 1 included" in easy and "try 20 requests/s" in easy
    fast = summary({"settings": dict(settings, rate=15.0), "results": [run("fixed 1", 0.5, True)]})
    assert "try 20 requests/s" in fast  # never past the slider's end
    alone = summary({"settings": settings, "results": [run("adaptive", 0.3, True)]})
    assert "Every policy" not in alone  # without tau = 1 in the run there is nothing to say about it

