"""The MARS side's "exact, fastest here" mode: `fastest_exact`'s configuration measured once per model
in the background, a clear fallback until then, the real pair starting in it, the line on what each
mode gives, and an API session starting on the same pair as a page."""
from __future__ import annotations

import json
import threading
import time

import pytest

from app_fixtures import PROMPT, pair  # noqa: F401
from mars_core import DecodeConfig
from playground import mars_side, tab_playground
from playground.core import Core
from playground.duel import AR_SIDES
from playground.errors import guard
from playground.fastest import FastestConfigs, tau_summary
from playground.models import Loaded, ModelStore
from playground.real_pair import RealPair
from playground.session import Session

CHOSEN = DecodeConfig(mode="lossless", block_size=4, prompt_lookup=2, prompt_lookup_tokens=10, draft_budget=(4, 1),
                      max_new_tokens=96)
REPORT = {"candidates": [{"config": "chain, groups last", "speedup": 1.2, "tokens_per_forward": 1.5},
                         {"config": "budget 4 nodes, 1 groups", "speedup": 1.62, "tokens_per_forward": 2.17}]}


def fake_measure(gate: threading.Event | None = None, fail: bool = False, chosen=CHOSEN, report=REPORT):
    calls = []

    def measure(model, tokenizer, **kw):
        calls.append(kw)
        if gate is not None:
            gate.wait(10)
        if fail:
            raise RuntimeError("no memory left for the cost curve\nsecond line")
        kw["report"].update(report)
        return chosen
    measure.calls = calls
    return measure


def wait_state(core, loaded, state="ready"):
    for _ in range(200):
        entry = core.fastest.get(loaded)
        if entry is not None and entry.state == state:
            return entry
        time.sleep(0.05)
    raise AssertionError(f"never {state}")


def make_tab(pair, measure):  # noqa: F811
    core = Core(*pair, store=ModelStore())
    core.fastest = FastestConfigs(measure)
    return core, tab_playground.PlaygroundTab(core)


def run(tab, session=None, mode="fastest", **kw):
    args = dict(prompt=PROMPT, tau=0.9, block_size=4, metric="probability", temperature=0.0, seed=0,
                max_new_tokens=24, cache="sliding", ar_side=AR_SIDES[1], slow_ms=0, session=session or Session(),
                mars_mode=mode)
    args.update(kw)
    return list(tab.generate(**args))[-1]


def test_fastest_mode_decodes_with_the_measured_config_once_ready(pair):  # noqa: F811
    measure = fake_measure()
    core, tab = make_tab(pair, measure)
    mars_side.fastest_entry(core, core.mars)
    wait_state(core, core.mars)
    out = guard(tab.api_generate)(PROMPT, max_new_tokens=24, ar_side=AR_SIDES[1], mars_mode="fastest")
    assert out["guaranteed"] and out["guarantee"] == "identical" and out["mars"]["token_ids"] == out["ar"]["token_ids"]
    session = Session()
    last = run(tab, session)
    cfg = session.last_mars.cfg
    assert (cfg.mode, cfg.draft_budget, cfg.prompt_lookup, cfg.compile) == ("lossless", (4, 1), 2, False)
    assert "MARS exact, fastest here" in last[2] and "still being measured" not in last[2]
    assert 'data-guaranteed="1"' in last[5]
    assert len(measure.calls) == 1 and measure.calls[0]["compile"] is False  # once per model, eager
    tab._duel(PROMPT, 0.9, 4, "probability", 0.0, 0, 8, "sliding", AR_SIDES[1], Session(), "fastest")
    assert len(measure.calls) == 1


def test_where_no_draft_pays_fastest_runs_ar_and_says_so(pair):  # noqa: F811
    ar = DecodeConfig(mode="ar", block_size=4, max_new_tokens=96)
    report = {"candidates": [{"config": "AR, no drafts", "speedup": 1.0, "tokens_per_forward": 1.0},
                             {"config": "chain, groups last", "speedup": 0.9, "tokens_per_forward": 1.5}]}
    core, tab = make_tab(pair, fake_measure(chosen=ar, report=report))
    mars_side.fastest_entry(core, core.mars)
    wait_state(core, core.mars)
    session = Session()
    last = run(tab, session)
    assert session.last_mars.cfg.mode == "ar" and 'data-guaranteed="1"' in last[5]
    assert "AR itself: no draft shape is modelled faster than AR" in mars_side.mode_line(core, core.mars)


def test_until_measured_it_runs_lookup_and_says_so(pair):  # noqa: F811
    gate = threading.Event()
    core, tab = make_tab(pair, fake_measure(gate))
    session = Session()
    last = run(tab, session)
    assert session.last_mars.cfg.prompt_lookup == 2 and session.last_mars.cfg.draft_budget is None
    assert "still being measured on this machine: this run used lossless MARS + prompt lookup" in last[2]
    assert 'data-guaranteed="1"' in last[5]  # the fallback is exact too
    assert "being measured" in mars_side.mode_line(core, core.mars)
    gate.set()
    wait_state(core, core.mars)
    assert "2.17 tokens per forward" in mars_side.mode_line(core, core.mars)


def test_a_failed_measurement_falls_back_in_one_line(pair):  # noqa: F811
    core, tab = make_tab(pair, fake_measure(fail=True))
    mars_side.fastest_entry(core, core.mars)
    wait_state(core, core.mars, "failed")
    last = run(tab)
    assert "could not be measured (no memory left for the cost curve)" in last[2] and "second line" not in last[2]
    assert "not measured" in mars_side.mode_line(core, core.mars)


def test_fastest_is_greedy(pair):  # noqa: F811
    _, tab = make_tab(pair, fake_measure())
    with pytest.raises(ValueError, match="decodes greedily: set temperature to 0"):
        guard(tab.api_generate)(PROMPT, temperature=0.5, mars_mode="fastest")


def test_the_real_pair_starts_in_fastest_the_tiny_one_in_tau(pair, monkeypatch):  # noqa: F811
    from mars_core import packaged

    core, tab = make_tab(pair, fake_measure())
    assert tab.mode_for_models(Session())[0]["value"] == "mars"
    monkeypatch.setattr(packaged, "is_named", lambda source: source == pair[0])
    mode, line = tab.mode_for_models(Session())
    assert mode["value"] == "fastest" and "On fixture-mars:" in line
    assert mars_side.default_mode(core.mars) == "fastest"


def test_the_mode_line_gives_both_modes_figures(tmp_path, pair):  # noqa: F811
    runs = [{"mode": "mars", "tau": 1.0, "block_size": 4, "accuracy": 0.266, "tokens_per_forward": 0.99},
            {"mode": "mars", "tau": 0.95, "block_size": 4, "accuracy": 0.233, "tokens_per_forward": 1.062}]
    (tmp_path / "eval.json").write_text(json.dumps({"runs": runs}))
    loaded = Loaded(model=None, tokenizer=None, source=str(tmp_path), quantization="none", name="m")
    assert tau_summary(loaded, 4) == ("MARS at tau 0.95: 1.06 tokens per forward, 23.3% right against 26.6% at tau 1 "
                                      "(the model card's sweep)")
    guarded = {"mode": "mars", "tau": 0.95, "block_size": 4, "accuracy": 0.266, "tokens_per_forward": 1.041,
               "repeat_guard": True}
    (tmp_path / "eval.json").write_text(json.dumps({"runs": [runs[0], guarded, runs[1]]}))
    assert tau_summary(loaded, 4).startswith("MARS at tau 0.95: 1.06 tokens per forward")  # no gate: the plain rule
    from conftest import make_model
    from mars_core.gate import attach_gate

    gated = make_model("llama", 64)
    attach_gate(gated, 3, rank=2)
    loaded = Loaded(model=gated, tokenizer=None, source=str(tmp_path), quantization="none", name="m")
    assert tau_summary(loaded, 4).startswith("MARS at tau 0.95 with the repeat guard: 1.04 tokens per forward, 26.6%")
    core, _ = make_tab(pair, fake_measure())
    mars_side.fastest_entry(core, core.mars)
    wait_state(core, core.mars)
    line = mars_side.mode_line(core, core.mars)
    assert "exact, fastest here: 2.17 tokens per forward on sample prompts (4 draft nodes" in line
    assert "4 draft nodes, 1 mask groups" in line and "no recorded sweep at tau 0.95" in line


def test_real_fastest_exact_runs_in_the_background(pair, tmp_path, monkeypatch):  # noqa: F811
    """The library's own measurement on the fixture model (cost curve kept under MARS_CACHE)."""
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    core = Core(*pair, store=ModelStore())
    entry = core.fastest.start(core.mars, ["What is 2 + 2?"], 4)
    for _ in range(600):
        if entry.state != "measuring":
            break
        time.sleep(0.1)
    assert entry.state == "ready", entry.error
    assert entry.config.mode == "lossless" and entry.config.compile is False and entry.chosen is not None
    assert list(tmp_path.rglob("*.json"))  # measured once, kept on disk


def test_the_real_pair_measures_fastest_when_it_loads(pair):  # noqa: F811
    core = Core(*pair, store=ModelStore())
    core.fastest = FastestConfigs(fake_measure())
    core.real = RealPair(core.store, mars=pair[1], ar=pair[0], prepare=lambda n: None,
                         on_ready=core.fastest.start).start()
    core.real.join(10)
    assert core.real.ready and core.fastest.get(core.store.get(pair[1])) is not None


def test_an_api_session_starts_on_the_pair_a_page_gets(pair):  # noqa: F811
    core = Core(*pair, store=ModelStore())
    core.real = RealPair(core.store, mars=pair[1], ar=pair[0], prepare=lambda n: None).start()
    core.real.join(10)

    class Request:
        session_hash = "api-client-1"

    api = core.session_of(Request())
    assert core.models_for(api)[0].name == "fixture-ar"  # the real pair's stand-in
    assert core.session_of(Request()) is api  # the client's later calls: the same session
    fresh_state = Session()  # the gr.State of an API client, which never fires the page's load event
    assert core.models_for(fresh_state)[0].name == "fixture-ar"
    page = Session()
    core.page_defaults(page)
    assert core.models_for(page)[0].name == "fixture-ar"
