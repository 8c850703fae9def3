"""The playground's exact MARS modes: lossless and spec on the MARS side, verified drafts shown
apart, and the agree line's guarantee only where the mode proves it."""
from __future__ import annotations

import pytest

from app_fixtures import OUT, PROMPT, Tabs, demo, pair, pg  # noqa: F401
from conftest import make_tokenizer
from playground import render
from playground.duel import AR_SIDES, MARS_MODES, Duel, Step
from playground.errors import guard
from playground.replay import decisions
from playground.session import Session


def run(pg, mode, tau=1.0, ar_side=AR_SIDES[1], max_new=24, cache="sliding"):  # noqa: F811
    outs = pg.playground.page_generate(PROMPT, tau, 4, "probability", 0.0, 0, max_new, cache, ar_side, 0,
                                         Session(), MARS_MODES[mode])
    return dict(zip(OUT, list(outs)[-1]))


@pytest.mark.parametrize("mode", ["lossless", "spec"])
def test_exact_modes_are_identical_to_ar_and_say_it(pg, mode):  # noqa: F811
    last = run(pg, mode)
    assert 'data-agree="1"' in last["compare"] and 'data-guaranteed="1"' in last["compare"]
    assert "identical to AR (guaranteed" in last["compare"]
    assert f"MARS {mode}" in last["mars"]


@pytest.mark.parametrize("mode,tau,ar_side", [
    ("mars", 1.0, AR_SIDES[1]),  # agrees, but MARS at tau 1 is not what the guarantee is about
    ("lossless", 1.0, AR_SIDES[0]),  # another model on the AR side
    ("spec", 0.5, AR_SIDES[1]),  # tau-accepted extra tokens are not verified
])
def test_no_guarantee_claimed_where_the_mode_does_not_prove_it(pg, mode, tau, ar_side):  # noqa: F811
    last = run(pg, mode, tau, ar_side)
    assert 'data-guaranteed="1"' not in last["compare"] and "guaranteed" not in last["compare"]
    why = {"mars": None, "lossless": "not the separate AR checkpoint", "spec": "tau went below 1"}[mode]
    assert why is None or why in last["compare"]  # an exact mode says why its guarantee does not apply
    if why is None:
        assert "muted" not in last["compare"]


def test_api_reports_the_guarantee(pg):  # noqa: F811
    out = guard(pg.playground.api_generate)(PROMPT, tau=0.9, max_new_tokens=16, ar_side=AR_SIDES[1],
                                            mars_mode="lossless")
    assert out["agree"] and out["guaranteed"]
    assert out["mars"]["token_ids"] == out["ar"]["token_ids"]
    plain = guard(pg.playground.api_generate)(PROMPT, tau=1.0, max_new_tokens=16, ar_side=AR_SIDES[1])
    assert not plain["guaranteed"]
    with pytest.raises(ValueError, match="mars_mode must be one of"):
        guard(pg.playground.api_generate)(PROMPT, mars_mode="turbo")


def test_spec_needs_a_draft_model(pg):  # noqa: F811
    settings = dict(tau=1.0, block_size=4, metric="probability", cache="cursor", temperature=0.0, seed=0,
                    max_new_tokens=8)
    with pytest.raises(ValueError, match="spec needs a draft model"):
        Duel(PROMPT, settings, AR_SIDES[1], pg.core.mars, None, 60, "spec")


def test_verified_drafts_render_apart():
    tok = make_tokenizer()
    track = render.TokenTrack(tok, 4)
    ids = tok("Tom has 12 apples")["input_ids"][:4]
    track.add(0, ids[:1], [0.9], 1.0)
    track.add(1, ids[1:4], [0.8, 0.7, 0.6], 1.0, verified=2)
    assert [s.split('"')[1] for s in track.spans] == ["tok", "tok verified", "tok"]
    assert "2 verified drafts (exact" in track.spans[1]
    assert track.text == tok.decode(ids, skip_special_tokens=True)
    panel = render.panel_html("mars", "MARS lossless", "m", track, None, "done")
    assert "verified draft" in panel and "Underlined" in panel


def test_replay_explains_verified_drafts():
    step = Step(start=0, proposed=[5, 6, 7, 8], confidences=[0.9, 0.8, 0.97, 0.5], accepted=3, tau=0.95,
                finished=False, verified=2)
    marks = decisions(step, "probability")
    assert [m for m, _ in marks] == ["accepted", "accepted", "accepted", "rejected"]
    assert "verified" in marks[0][1] and "own AR prediction" in marks[2][1]
