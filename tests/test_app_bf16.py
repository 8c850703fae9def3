"""Exact, said per dtype: in float32 the exact modes' output is guaranteed identical to AR; in bf16
each MARS token is the model's own argmax in the forward that verified it, and where the sides
part the page says why (a near-tie, measured). The real pair is served in bf16 where the CPU has
native bf16, and prepack packs it or leaves it cleanly."""
from __future__ import annotations

import pytest
import torch

from app_fixtures import pair  # noqa: F401
from mars_core import load_model
from playground import exactness, tab_playground
from playground.core import Core
from playground.duel import AR_SIDES
from playground.errors import guard
from playground.models import ModelStore, hub_loader
from playground.session import Session

PROMPTS = ["What is 24 * 3?", "Tom has 12 apples.", "hello world", "Convert 5 hours"]


def tab_in(pair, dtype, unsure=False):  # noqa: F811
    """The app on the fixture pair in `dtype`; `unsure`: the MARS side runs the plain random model (its
    top candidates are close, so bf16 near-ties are common)."""
    store = ModelStore(loader=lambda src, **kw: load_model(src, dtype=dtype, device="cpu"), prepack=False)
    return tab_playground.PlaygroundTab(Core(*(pair[::-1] if unsure else pair), store=store))


def final(tab, prompt, mode="lookup"):
    out = list(tab.generate(prompt, 0.9, 4, "probability", 0.0, 0, 40, "sliding", AR_SIDES[1], 0, Session(), mode))
    return out[-1]


def test_float32_exact_output_is_guaranteed_identical(pair):  # noqa: F811
    tab = tab_in(pair, torch.float32, unsure=True)
    for prompt in PROMPTS:
        out = guard(tab.api_generate)(prompt, max_new_tokens=40, ar_side=AR_SIDES[1], mars_mode="lookup")
        assert out["mars"]["token_ids"] == out["ar"]["token_ids"]
        assert (out["guaranteed"], out["guarantee"], out["precision"]) == (True, "identical", "float32")
    assert 'data-guaranteed="1"' in final(tab, PROMPTS[0])[5]


def test_bf16_label_follows_the_dtype_and_a_difference_is_explained(pair):  # noqa: F811
    """A random bf16 model has many near-ties: whichever way each prompt goes, the page says the
    bf16 guarantee, never "guaranteed identical", and a difference comes with its measured tie."""
    tab = tab_in(pair, torch.bfloat16, unsure=True)
    seen = set()
    for prompt in PROMPTS:
        out = guard(tab.api_generate)(prompt, max_new_tokens=40, ar_side=AR_SIDES[1], mars_mode="lookup")
        assert (out["guaranteed"], out["guarantee"], out["precision"]) == (False, "argmax", "bfloat16")
        compare = final(tab, prompt)[5]
        assert 'data-guaranteed="1"' not in compare and "guaranteed:" not in compare
        if out["mars"]["token_ids"] == out["ar"]["token_ids"]:
            seen.add("agree")
            assert 'data-guaranteed="bfloat16"' in compare and "own argmax in the forward that verified it" in compare
            assert out["why"] is None
        else:
            seen.add("differ")
            assert 'data-agree="0"' in compare and "bfloat16 rounds differently by shape" in compare
            assert "a near-tie" in compare and "In float32 the outputs are identical" in compare
            assert "near-tie" in out["why"]
    assert seen  # every prompt took one of the two branches


def test_the_tie_is_measured_where_the_outputs_part(pair):  # noqa: F811
    tab = tab_in(pair, torch.bfloat16)
    mars, _ = tab.core.models_for(None)
    ids = guard(tab.api_generate)(PROMPTS[0], max_new_tokens=12, ar_side=AR_SIDES[1], mars_mode="lossless")["ar"]["token_ids"]
    other = list(ids)
    other[5] = (other[5] + 1) % 200
    j, gap = exactness.tie_gap(mars, PROMPTS[0], ids, other)
    assert j == 5 and gap >= 0
    assert exactness.tie_gap(mars, PROMPTS[0], ids, list(ids)) is None
    note = exactness.differ_note("bfloat16", (j, gap))
    assert f"At token 6 the model's top two candidates are {gap:.3f} apart" in note


def test_non_exact_modes_claim_nothing_in_bf16(pair):  # noqa: F811
    tab = tab_in(pair, torch.bfloat16)
    out = guard(tab.api_generate)(PROMPTS[0], tau=0.9, max_new_tokens=12, ar_side=AR_SIDES[1], mars_mode="mars")
    assert out["guarantee"] is None and not out["guaranteed"]


def test_the_real_pair_is_served_in_bf16_where_the_cpu_has_it(monkeypatch):
    from mars_core import packaged

    asked = []
    store = ModelStore(device="cpu", loader=hub_loader(lambda src, **kw: asked.append((src, kw["dtype"])) or (1, 2)))
    monkeypatch.setattr(packaged, "is_named", lambda source: source == "smollm2-135m-mars")
    store.get("smollm2-135m-mars")
    store.get("/srv/models/tiny-mars-b4")
    assert asked == [("smollm2-135m-mars", "auto"), ("/srv/models/tiny-mars-b4", None)]


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_only_with_native_bf16(native):
    from mars_core.cpu import cpu_dtype

    assert cpu_dtype("auto", native)[0] == (torch.bfloat16 if native else torch.float32)


def test_prepack_in_bf16_packs_or_leaves_the_model_cleanly(pair):  # noqa: F811
    from mars_core.cpu import PackedLinear

    model, tok = load_model(pair[0], dtype=torch.bfloat16, device="cpu", prepack=True)
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    note = model.mars_dtype_note
    assert (packed > 0 and note is None) or (packed == 0 and "cannot pack" in note)
    plain, _ = load_model(pair[0], dtype=torch.bfloat16, device="cpu")
    store = ModelStore(loader=lambda src, **kw: (model, tok) if src == pair[0] else (plain, tok))
    core = Core(pair[0], None, store=store)
    assert "bfloat16" in core.model_status()
    out = guard(tab_playground.PlaygroundTab(core).api_generate)(PROMPTS[0], max_new_tokens=12, mars_mode="lossless",
                                                                 ar_side=AR_SIDES[1])
    assert out["ar"]["stats"]["tokens"] == 12 and out["precision"] == "bfloat16"

