"""`fastest_exact`: the replay of a configuration is the decoder's own forwards; the choice is exact
and follows the cost curve; the measurements are kept on disk."""
import os

import pytest

from mars_core import DecodeConfig, generate, load_model
from mars_core import fastest
from test_bundled_models import ROOT

PROMPTS = ["What is the sum of [58, 64, 50, 37]?", "Sort [5, 3, 9, 1, 7] ascending.", "What is 12 + 30?",
           "Tom has 12 apples. Tom has 12 apples. Tom has"]


@pytest.fixture(scope="module")
def bundled():
    return load_model(os.path.join(ROOT, "tiny-mars-b4"), device="cpu")


@pytest.fixture(scope="module")
def samples(bundled):
    model, tok = bundled
    return fastest.sample(model, tok, PROMPTS, 4, 48)


@pytest.mark.parametrize("cfg", fastest.candidates(4, 10) + [DecodeConfig(mode="lossless", draft_tree=(2, 1, 1)),
                                                           DecodeConfig(mode="lossless")],
                         ids=lambda c: str(c.draft_budget or c.draft_tree or c.draft_groups))
def test_the_replay_takes_the_decoders_forwards_at_the_decoders_widths(bundled, samples, cfg, monkeypatch):
    """Each prompt decoded alone: the forwards and the window width of each, as the replay says."""
    from mars_core import decode_shaped
    model, tok = bundled
    widths, step = [], decode_shaped.window_step

    def spy(model, cache, w, *args, **kw):
        widths.append(w.ids.shape[1])
        return step(model, cache, w, *args, **kw)
    monkeypatch.setattr(decode_shaped, "window_step", spy)
    for prompt, s in zip(PROMPTS, samples):
        widths.clear()
        res = generate(model, tok, [prompt], DecodeConfig(**{**cfg.__dict__, "max_new_tokens": 48}))
        assert widths == fastest.replay(s, cfg), prompt
        assert list(s.text[s.first + 1:s.first + 1 + len(res.token_ids[0])]) == res.token_ids[0]


def test_the_costs_are_measured_once_and_kept(bundled, tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    model, _ = bundled
    calls = []
    real = model.forward

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(model, "forward", counting)
    curve = fastest.forward_costs(model, repeats=2)
    measured = len(calls)
    assert measured > 0 and curve[1] == 1.0 and set(curve) == set(fastest.WIDTHS) and all(c > 0 for c in curve.values())
    assert fastest.forward_costs(model, repeats=2) == curve and len(calls) == measured  # read from disk
    assert fastest.cost_at({1: 1.0, 4: 1.3, 8: 2.1}, 6) == pytest.approx(1.7)
    assert fastest.cost_at({1: 1.0, 4: 1.3, 8: 2.1}, 12) == pytest.approx(2.9)


def test_the_choice_is_exact_and_follows_the_costs(bundled, samples, tmp_path, monkeypatch):
    """Where wide forwards are free the widest budget wins; where every position costs as much as a
    forward of one, no draft pays and AR itself is the answer; the chosen config decodes the AR
    output either way."""
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    model, tok = bundled
    flat = {w: 1.0 for w in fastest.WIDTHS}
    steep = {w: float(w) for w in fastest.WIDTHS}
    speeds = {}
    for name, curve in (("flat", flat), ("steep", steep)):
        monkeypatch.setattr(fastest, "forward_costs", lambda *a, curve=curve, **kw: curve)
        report = {}
        cfg = fastest.fastest_exact(model, tok, prompts=PROMPTS, max_new_tokens=48, report=report)
        speeds[name] = (cfg, report)
        ar = generate(model, tok, PROMPTS, DecodeConfig(mode="ar", max_new_tokens=48)).token_ids
        assert cfg.mode == ("lossless" if name == "flat" else "ar") and cfg.temperature == 0
        assert generate(model, tok, PROMPTS, cfg).token_ids == ar
    flat_cfg, flat_report = speeds["flat"]
    best_tpf = max(c["tokens_per_forward"] for c in flat_report["candidates"])
    chosen = next(c for c in flat_report["candidates"] if c["speedup"] == max(x["speedup"] for x in flat_report["candidates"]))
    assert chosen["tokens_per_forward"] == best_tpf  # free width: the most tokens per forward wins
    steep_report = speeds["steep"][1]
    ar_line, *drafted = steep_report["candidates"]
    assert ar_line == dict(config="AR, no drafts", speedup=1.0, tokens_per_forward=1.0)
    assert drafted and max(c["speedup"] for c in drafted) < 1.0  # every extra position costs a forward


def test_a_budget_plan_from_the_rule():
    """Hand-computed: paths by joint probability, pre-order numbering, groups after the likeliest ends."""
    from mars_core.draft_plan import Candidates, budget_plan
    c = Candidates(ids=((10, 11, 12), (20, 21, 22), (30, 31, 32)), probs=((0.7, 0.2, 0.1), (0.9, 0.05, 0.05), (0.5, 0.4, 0.1)))
    # paths: 10: .7, 10-20: .63, 10-20-30: .315, 10-20-31: .252, 11: .2, then 10-20-32 .063, ...
    p = budget_plan(c, 3, 5, 2)
    assert p.tokens == (10, 20, 30, 31, 11) and p.shape.parents == (0, 1, 2, 2, 0)
    # ends: root 1 - .7 - .2 = .1, 10: .07, 10-20: .063, 10-20-30: .315, 10-20-31: .252, 11: .2
    assert p.shape.group_nodes == (3, 4)
    assert budget_plan(c, 3, 5, 3).shape.group_nodes == (3, 4, 5)
    # a copied chain 11, 99 at the prior .6, .36 displaces the least likely mask paths
    q = budget_plan(c, 3, 5, 1, copied=[11, 99, 98])
    assert q.tokens == (10, 20, 30, 11, 99) and q.shape.parents == (0, 1, 2, 0, 4) and q.shape.group_nodes == (5,)
    assert budget_plan(Candidates(), 3, 4, 2).tokens == ()  # nothing to draft: a group after the root only
    assert budget_plan(Candidates(), 3, 4, 2).shape.group_nodes == (0,)


def test_the_modelled_speedup_from_the_rule():
    """A sample whose masks are always right: the chain emits B tokens a forward after the first,
    each forward 1 + 3 + 3 = 7 wide ("last"); at c(W) = W the speed-up is B / 7 of AR's."""
    first, n = 2, 1 + 12  # the prompt's last token at 2; 13 tokens after it, the first from the prefill
    text = tuple(range(100, 100 + first + 1 + n))
    rows = len(text) - first
    ids = tuple(tuple((text[t + m] if t + m < len(text) else 0,) for m in range(2, 5)) for t in range(first, first + rows))
    probs = tuple(tuple((0.99,) for _ in range(3)) for _ in range(rows))
    s = fastest.Sample(text, first, ids, probs)
    cfg = DecodeConfig(mode="lossless", block_size=4)
    assert fastest.replay(s, cfg) == [first + 1 + 3] + [7] * 3  # 12 tokens: 3 forwards of 4
    speed, tpf = fastest.modelled_speedup([s], cfg, {w: float(w) for w in fastest.WIDTHS})
    assert tpf == pytest.approx(4.0) and speed == pytest.approx(12 / 21)
    # AR pays one unit a token whatever the curve says at width 1 (a measured curve has c(1) = 1: it is the unit)
    speed, _ = fastest.modelled_speedup([s], cfg, {w: 0.2 + w for w in fastest.WIDTHS})
    assert speed == pytest.approx(12 / (3 * 7.2))


def test_a_cost_curve_is_kept_per_kind_of_kernel_a_gated_layer_runs():
    """A gated model's forward costs what its base's kernels and its adapters' form make it cost:
    a curve measured on the prepacked, unstacked model must not serve the inductor-packed or the
    stacked one (the key once read only the wrapper's class, GatedLinear, for all of them)."""
    from test_frozen_layers import tiny_llama
    from mars_core.cpu import prepack
    from mars_core.gate import attach_gate, fuse_siblings

    keys = set()
    for packed in (False, True):
        model = tiny_llama()
        if packed:
            prepack(model)
        attach_gate(model, 5, rank=2)
        keys.add(fastest.machine_key(model, 1))
        fuse_siblings(model)
        keys.add(fastest.machine_key(model, 1))
    assert len(keys) == 4
    assert fastest.machine_key(tiny_llama(), 1) not in keys


def test_the_curves_unit_is_a_forward_of_the_base_and_its_windows_hold_masks():
    """AR pays the base's forward; a step's window pays the adapters, and its tail is masks."""
    from test_frozen_layers import tiny_llama
    from mars_core.gate import attach_gate, gate_of

    model = tiny_llama()
    attach_gate(model, 5, rank=2)
    gate, seen = gate_of(model), []
    real = model.forward

    def spy(*a, input_ids=None, **kw):
        out = real(*a, input_ids=input_ids, **kw)
        seen.append((input_ids.shape[1], int((input_ids == 5).sum()), gate.on is False))
        return out
    model.forward = spy
    fastest.forward_costs(model, context=16, repeats=2, widths=(1, 4), cache=False)
    timed = seen[1:]  # after the context's forward
    assert timed.count((1, 0, True)) == 3  # the unit, a warm-up and 2 rounds: no mask, the adapters skipped
    assert timed.count((4, 2, False)) == 3  # the root, a draft, then masks: the adapters run
    assert len(timed) == 6


def test_a_cost_curve_is_kept_per_gate_shape():
    """A gate on fewer matrices, fewer layers or another rank runs other adapters a forward: a curve
    measured on one must not serve another (the kernel kind alone reads only the first q_proj)."""
    from test_frozen_layers import tiny_llama
    from mars_core.gate import attach_gate, fuse_siblings

    keys = set()
    for kw in (dict(rank=2), dict(rank=3), dict(rank=2, layers=2), dict(rank=2, matrices=("q_proj", "v_proj"))):
        model = tiny_llama()
        attach_gate(model, 5, **kw)
        fuse_siblings(model)
        keys.add(fastest.machine_key(model, 1))
    assert len(keys) == 4

