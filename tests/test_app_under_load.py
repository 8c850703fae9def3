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
