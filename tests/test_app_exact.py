"""The playground's exact MARS modes: lossless and spec on the MARS side, verified drafts shown
apart, and the agree line's guarantee only where the mode proves it."""
from __future__ import annotations

import re

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


@pytest.mark.parametrize("mode", ["lossless", "lookup", "tree", "spec"])
def test_exact_modes_are_identical_to_ar_and_say_it(pg, mode):  # noqa: F811
    last = run(pg, mode)
    assert 'data-agree="1"' in last["compare"] and 'data-guaranteed="1"' in last["compare"]
    assert "identical to AR (guaranteed" in last["compare"]
    assert {"lookup": "MARS lossless + lookup", "tree": "MARS lossless + tree"}.get(mode, f"MARS {mode}") in last["mars"]


def test_lookup_mode_copies_drafts_where_the_text_repeats(pg):  # noqa: F811
    """A prompt that repeats itself: the lookup mode verifies copied drafts (more tokens per forward
    than the masks alone give, some steps past a block), and its output is still AR's."""
    prompt = "Tom has 12 apples. Tom has 12 apples. Tom has 12 apples. Tom has"
    outs = {}
    for mode in ("lossless", "lookup"):
        outs[mode] = guard(pg.playground.api_generate)(prompt, max_new_tokens=48, ar_side=AR_SIDES[1], mars_mode=mode)
        assert outs[mode]["guaranteed"] and outs[mode]["mars"]["token_ids"] == outs[mode]["ar"]["token_ids"]
    plain, lookup = (outs[m]["mars"]["accepted_per_step"] for m in ("lossless", "lookup"))
    assert len(lookup) < len(plain) and max(lookup) > 4


def test_lookup_mode_refuses_sampling_in_one_line(pg):  # noqa: F811
    with pytest.raises(ValueError, match="prompt lookup drafts greedily: set temperature to 0"):
        guard(pg.playground.api_generate)(PROMPT, temperature=0.7, mars_mode="lookup")
    with pytest.raises(ValueError, match="the draft tree drafts greedily from the masks: set temperature to 0"):
        guard(pg.playground.api_generate)(PROMPT, temperature=0.7, mars_mode="tree")


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


@pytest.mark.parametrize("block_size, widths", [(4, (2, 2, 1)), (2, (2,)), (8, (2, 2, 1))])
def test_tree_mode_drafts_the_tree_the_block_allows(pg, block_size, widths):  # noqa: F811
    settings = dict(tau=1.0, block_size=block_size, metric="probability", cache="sliding", temperature=0.0, seed=0,
                    max_new_tokens=8)
    cfg = Duel(PROMPT, settings, AR_SIDES[1], pg.core.mars, None, 60, "tree").mars.cfg
    assert (cfg.mode, cfg.cache, cfg.draft_tree) == ("lossless", "cursor", widths)
    with pytest.raises(ValueError, match="block size B >= 2"):
        Duel(PROMPT, dict(settings, block_size=1), AR_SIDES[1], pg.core.mars, None, 60, "tree")


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


def test_the_steps_chart_fits_a_step_longer_than_a_block():
    """Prompt lookup verifies up to 11 tokens in one forward at B = 4: the bar stays in the chart."""
    html = render.steps_chart_html([11, 1, 4], [1.0, 1.0, 1.0], 4)
    bars = re.findall(r'data-n="(\d+)" x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', html)
    assert [int(n) for n, _, _ in bars] == [11, 1, 4]
    assert all(float(y) >= 10 - 1e-6 for _, y, _ in bars)  # below the chart's top padding
    assert float(bars[0][2]) == max(float(h) for _, _, h in bars) and "left axis 0-11" in html


def test_the_colour_key_says_when_a_forward_took_more_than_a_block():
    tok = make_tokenizer()
    track = render.TokenTrack(tok, 4)
    ids = tok("Tom has 12 apples and Tom has 12 apples")["input_ids"]
    track.add(0, ids[:2], [0.9, 0.9], 1.0, verified=1)
    assert ">4</span>" in render.panel_html("mars", "MARS lossless", "m", track, None, "done")
    track.add(1, ids[2:9], [0.8] * 7, 1.0, verified=6)
    assert ">4+</span>" in render.panel_html("mars", "MARS lossless", "m", track, None, "done")
