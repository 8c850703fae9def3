"""The Gradio playground: every handler called directly, then the named API through gradio_client
against a launched app. Tiny random models saved to a temp folder; CPU only, nothing downloaded."""
from __future__ import annotations

import json
import os
import re
import socket
import sys

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gradio as gr  # noqa: E402

import app  # noqa: E402
from conftest import make_model, make_tokenizer  # noqa: E402
from mars_core import mars_training_mask  # noqa: E402
from playground import render  # noqa: E402
from playground.core import Core  # noqa: E402
from playground.duel import AR_SIDES  # noqa: E402
from playground.errors import guard  # noqa: E402
from playground.models import ModelStore, display_name, scrub  # noqa: E402
from playground.session import Session  # noqa: E402
from playground.tab_frontier import FrontierTab  # noqa: E402

PROMPT = "What is 24 * 3?"
EVAL = {"n": 3, "seed": 0, "split": "eval", "runs": [
    {"model": "ar-baseline", "mode": "ar", "tau": 0.95, "block_size": 1, "accuracy": 0.2,
     "accuracy_by_family": {}, "tokens_per_forward": 1.0, "tokens_per_second": 100.0},
    {"model": "mars", "mode": "mars", "tau": 0.9, "block_size": 4, "accuracy": 0.3,
     "accuracy_by_family": {}, "tokens_per_forward": 1.8, "tokens_per_second": 170.0, "matches_ar": 0.5},
]}


def save_pair(root) -> tuple[str, str]:
    """A confident MARS stand-in (LM head x30: tau=1 gives 1 token/step, tau=0 gives B) and a plain AR."""
    tok = make_tokenizer()
    paths = []
    for name, seed, scale in (("fixture-mars", 1, 30.0), ("fixture-ar", 0, 1.0)):
        m = make_model("qwen2", len(tok), seed=seed, head_scale=scale)
        m.generation_config.eos_token_id = tok.eos_token_id
        path = os.path.join(root, name)
        m.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    with open(os.path.join(paths[0], "eval.json"), "w") as f:
        json.dump(EVAL, f)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    return save_pair(str(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def demo(pair):
    torch.set_num_threads(1)
    return app.build_app(*pair, max_new_tokens_cap=256, max_seconds=60, frontier_max_n=8, batch_max=4)


class Tabs:
    """The handlers of every tab of one app: tabs.playground.generate(...), tabs.models.load(...)."""

    def __init__(self, demo):
        self.core = demo.core
        for name, tab in demo.tabs.items():
            setattr(self, name, tab)


@pytest.fixture
def pg(demo):
    return Tabs(demo)


def run_ui(pg, session=None, prompt=PROMPT, tau=0.9, block=4, metric="probability", temperature=0.0, seed=0,
           max_new=40, cache="sliding", ar_side=AR_SIDES[0]):
    session = session or Session()
    return list(guard(pg.playground.generate)(prompt, tau, block, metric, temperature, seed, max_new, cache, ar_side,
                                          session))


def spans(html_text: str) -> list[tuple[int, int]]:
    return [(int(s), int(n)) for s, n in re.findall(r'class="tok" data-step="(\d+)" data-n="(\d+)"', html_text)]


# ---- building and the playground handler -------------------------------------------------------

def test_build_has_named_endpoints_and_queue_limits(demo):
    names = {d.api_name for d in demo.fns.values()}
    assert {"generate", "generate_stream", "frontier", "batch", "mask", "load_models"} <= names
    assert demo._queue.max_size == 16
    gen = next(d for d in demo.fns.values() if d.api_name == "generate_stream")
    assert gen.concurrency_limit == 2
    cfg = json.dumps(demo.get_config_file(), default=str)
    assert "fixture-mars" in cfg and ROOT not in cfg and "/tmp/" not in cfg  # names, never server paths


def test_generate_streams_both_panels(pg):
    outs = run_ui(pg, tau=0.5, max_new=30)
    assert len(outs) >= 2
    ar_html, mars_html, gauge, steps, cmp = outs[-1]
    assert 'data-status="done"' in ar_html and 'data-status="done"' in mars_html
    ar_spans, mars_spans = spans(ar_html), spans(mars_html)
    assert sum(n for _, n in ar_spans) == 30 and all(n == 1 for _, n in ar_spans)
    assert sum(n for _, n in mars_spans) == 30 and len(mars_spans) < 30  # several tokens per forward
    assert 'title="step 1:' in mars_html and "confidence" in mars_html and "legend" in mars_html
    for key in ("forwards", "tokens/forward", "tokens/s", "wall"):
        assert key in mars_html
    assert gauge.data[0].type == "indicator" and gauge.data[0].value > 0
    assert 'class="bar"' in steps
    assert "compare" in cmp and "data-agree" in cmp
    assert "fixture-ar" in ar_html and "fixture-mars" in mars_html


def test_tau_one_on_the_mars_model_agrees_with_ar(pg):
    outs = run_ui(pg, tau=1.0, ar_side=AR_SIDES[1], max_new=25)
    ar_html, mars_html, _, _, cmp = outs[-1]
    assert 'data-agree="1"' in cmp
    assert all(n == 1 for _, n in spans(mars_html))
    assert "(1 token/step)" in ar_html


def test_live_tau_changes_the_same_generation(pg):
    session = Session()
    gen = guard(pg.playground.generate)(PROMPT, 1.0, 4, "probability", 0.0, 0, 120, "sliding", AR_SIDES[1], session)
    first = next(gen)
    assert session.mars_control is not None and session.mars_control.tau == 1.0
    other = Session()
    pg.playground.set_tau(0.0, "probability", other)  # another session's slider: no effect
    assert session.mars_control.tau == 1.0
    pg.playground.set_tau(0.0, "probability", session)
    assert session.mars_control.tau == 0.0
    outs = [first] + list(gen)
    acc = session.last_accepted
    assert acc[0] == 1 and acc[-2] == 4 and max(acc) == 4
    assert session.mars_control is None  # released when done
    assert 'data-n="4"' in outs[-1][1]


def test_stop_ends_the_generation(pg):
    session = Session()
    gen = guard(pg.playground.generate)(PROMPT, 1.0, 4, "probability", 0.0, 0, 200, "sliding", AR_SIDES[0], session)
    next(gen)
    pg.playground.stop(session)
    last = list(gen)[-1]
    assert 'data-status="stopped"' in last[0] and 'data-status="stopped"' in last[1]
    assert sum(n for _, n in spans(last[1])) < 200


def test_time_limit_stops_long_jobs(pair):
    small = app.build_app(*pair, max_seconds=0.0)
    outs = run_ui(Tabs(small), tau=1.0, max_new=200)
    assert "time limit" in outs[-1][1] or "limit" in outs[-1][1]
    assert sum(n for _, n in spans(outs[-1][1])) < 200


@pytest.mark.parametrize("metric,cache", [("entropy", "none"), ("margin", "block")])
def test_metrics_and_caches(pg, metric, cache):
    tau = 0.3 if metric == "entropy" else 0.5
    outs = run_ui(pg, tau=tau, metric=metric, cache=cache, max_new=16, temperature=0.7, seed=3)
    assert 'data-status="done"' in outs[-1][1]


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(prompt="word " * 700), "positions but the model has 512"),
    (dict(prompt="x" * 20001), "the limit is 20,000"),
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
])
def test_bad_input_is_a_clear_error(pg, kwargs, message):
    with pytest.raises(gr.Error) as e:
        run_ui(pg, **kwargs)
    assert message in str(e.value.message) and "Traceback" not in str(e.value.message)


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


# ---- the other tabs -----------------------------------------------------------------------------

def test_frontier_initial_and_run(pg, pair, tmp_path):
    fig, note = pg.frontier.initial()
    assert len(fig.data) >= 2 and "fixture-mars" in note and "3 held-out" in note
    calls = []
    fig, note = guard(pg.frontier.run)(2, "1.0, 0.0", 4, 16, Session(),
                                           progress=lambda *a, **k: calls.append(a))
    assert len(calls) >= 4 and "| ar-baseline | ar |" in note and "| mars | mars | 4 | 0.0 |" in note
    assert {tr.name for tr in fig.data} >= {"ar-baseline AR", "mars AR", "mars MARS B=4"}
    with pytest.raises(gr.Error):
        guard(pg.frontier.run)(9999, "1.0", 4, 16, Session(), progress=lambda *a, **k: None)
    with pytest.raises(gr.Error):
        guard(pg.frontier.run)(2, "1.0, x", 4, 16, Session(), progress=lambda *a, **k: None)


def test_frontier_without_eval_json_says_so(pair):
    fig, note = FrontierTab(Core(pair[1], None, store=ModelStore())).initial()
    assert "no precomputed sweep" in note
    assert "eval.json" in fig.layout.annotations[0].text


@pytest.mark.parametrize("cache", ["none", "sliding", "block"])
def test_batch_timeline(pg, cache):
    summary, fig = guard(pg.batch.run)(3, cache, 8, 0.0, 4, 16, Session())
    assert "Speed-up of MARS over AR" in summary and "| AR (KV cache) |" in summary
    z = fig.data[0].z
    assert len(z) == 3 and all(sum(row) == 16 for row in z)
    with pytest.raises(gr.Error):
        guard(pg.batch.run)(99, cache, 8, 0.0, 4, 16, Session())


def test_mask_plot_is_the_library_mask(pg):
    fig = pg.how.mask_plot(8, 4)
    assert fig.data[0].z == tuple(tuple(r) for r in mars_training_mask(8, 4).int().tolist()) or \
        [list(r) for r in fig.data[0].z] == mars_training_mask(8, 4).int().tolist()
    assert pg.how.mask_api(4, 2) == mars_training_mask(4, 2).int().tolist()
    with pytest.raises(gr.Error):
        guard(pg.how.mask_plot)(0, 4)


def test_window_plot_of_last_generation(pg):
    session = Session()
    fig = pg.how.window_plot(session)
    assert "Generate something" in fig.layout.annotations[0].text
    run_ui(pg, session=session, tau=0.0, max_new=12)
    fig = pg.how.window_plot(session)
    assert len(fig.data[0].z) == 3  # 12 tokens, 4 per forward


# ---- models ---------------------------------------------------------------------------------------

def test_model_picker_per_session(pg, pair):
    session = Session()
    status, block, fig, note = guard(pg.models.load)("custom", pair[1], "", "none", session)
    assert "fixture-ar" in status and "(none" in status and pair[1] not in status
    assert "no precomputed sweep" in note
    other = Session()
    assert pg.core.models_for(other)[0].name == "fixture-mars"  # others keep the defaults
    outs = run_ui(pg, session=session, max_new=8)
    assert "fixture-ar" in outs[-1][1]
    status, *_ = guard(pg.models.load)("bundled", "", "", "none", session)
    assert "fixture-mars" in status


def test_model_load_failure_is_clear_and_pathless(pg, tmp_path):
    bad = str(tmp_path / "secret" / "nowhere")
    with pytest.raises(gr.Error) as e:
        guard(pg.models.load)("custom", bad, "", "none", Session())
    msg = e.value.message
    assert "does not exist" in msg and str(tmp_path) not in msg and "nowhere" in msg
    with pytest.raises(gr.Error) as e:
        guard(pg.models.load)("custom", "", "", "none", Session())
    assert "give the MARS model" in e.value.message
    with pytest.raises(gr.Error):
        guard(pg.models.load)("custom", "x", "", "16bit", Session())


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
    if "spaces" in sys.modules:
        pytest.skip("spaces installed")
    f = lambda: 1  # noqa: E731
    assert app.GPU(f) is f and app.GPU(duration=10)(f) is f


def test_render_handles_split_characters():
    tok = make_tokenizer()
    ids = tok("é ü 😀", add_special_tokens=False)["input_ids"]
    track = render.TokenTrack(tok, 4)
    for i, t in enumerate(ids):
        track.add(i, [t], [0.5], 0.9)
    text = "".join(re.sub(r"<[^>]+>", "", s) for s in track.spans).replace("&#8203;", "")
    import html as h
    assert h.unescape(text) == "é ü 😀" == track.text
    assert render.first_difference("abc", "abd") == 2 and render.first_difference("a", "a") is None


# ---- through gradio_client against a launched app -------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(demo):
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def test_client_generate(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    out = client.predict(PROMPT, 0.0, 4, "probability", 0.0, 0, 16, "sliding", AR_SIDES[0], api_name="/generate")
    assert out["mars"]["accepted_per_step"] == [4, 4, 4, 4]
    assert out["ar"]["stats"]["tokens"] == 16 and out["mars"]["stats"]["tokens_per_forward"] == 4.0
    out = client.predict(prompt=PROMPT, tau=1.0, ar_side=AR_SIDES[1], max_new_tokens=12, api_name="/generate")
    assert out["agree"] is True and out["first_difference"] is None
    mask = client.predict(4, 2, api_name="/mask")
    assert mask == mars_training_mask(4, 2).int().tolist()


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt=""), "prompt is empty"),
    (dict(prompt=PROMPT, max_new_tokens=100_000), "max new tokens must be between"),
    (dict(prompt=PROMPT, tau=-0.5), "tau for the probability metric must be in [0, 1]"),
    (dict(prompt=PROMPT, block_size=999), "block size must be between"),
    (dict(prompt=PROMPT, metric="nope"), "unknown metric"),
])
def test_client_bad_input(server, kwargs, message):
    from gradio_client import Client

    client = Client(server, verbose=False)
    with pytest.raises(Exception) as e:
        client.predict(api_name="/generate", **kwargs)
    assert message in str(e.value) and "Traceback" not in str(e.value)
