"""Prepacked linear layers never serve stale weights (`mars_core.cpu.PackedLinear`): after a
`load_state_dict`, an in-place edit, a new tensor behind the Parameter, a cast or a copy, eager
and compiled forwards compute with the weight the layer holds now."""
import pytest
import torch

from conftest import make_model
from mars_core.cpu import prepack


def _packed_and_plain(kind="llama", seed=0):
    """A prepacked tiny model and a plain copy of it, to compare against."""
    model, plain = make_model(kind, 96, seed=seed), make_model(kind, 96, seed=seed)
    assert prepack(model)[1] is None
    return model, plain


IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


def _same_logits(a, b, atol=1e-4):
    with torch.no_grad():
        torch.testing.assert_close(a(input_ids=IDS).logits, b(input_ids=IDS).logits, atol=atol, rtol=atol)


def test_a_packed_model_follows_load_state_dict():
    model, _ = _packed_and_plain()
    other = make_model("llama", 96, seed=3)
    _same_logits(model, model)  # packed once, used once
    model.load_state_dict(other.state_dict())
    _same_logits(model, other)


def test_a_packed_model_follows_in_place_edits_and_new_data():
    model, plain = _packed_and_plain()
    with torch.no_grad():
        for m in (model, plain):
            m.model.layers[0].mlp.down_proj.weight.mul_(3.0)
            m.model.layers[1].self_attn.q_proj.weight.zero_()
    _same_logits(model, plain)
    fresh = torch.randn(96, 64)
    for m in (model, plain):
        m.lm_head.weight.data = fresh.clone()  # a new tensor behind the Parameter
    _same_logits(model, plain)
    model.lm_head.weight.data.mul_(2.0)  # behind the version counter's back: repack() says so
    plain.lm_head.weight.data.mul_(2.0)
    model.lm_head.repack()
    _same_logits(model, plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_a_packed_model_follows_a_cast(dtype):
    """bf16 packs again in bf16 (where oneDNN can; else F.linear); float64, which oneDNN cannot
    pack, runs F.linear: the numbers are the cast model's either way."""
    model, plain = _packed_and_plain()
    _same_logits(model, plain)
    model.to(dtype)
    plain.to(dtype)
    _same_logits(model, plain, atol=1e-2 if dtype == torch.bfloat16 else 1e-10)
    layer = model.model.layers[0].mlp.up_proj
    assert layer.packed is None or layer.packed.dtype == dtype  # never the float32 copy


def test_a_packed_model_can_be_copied_and_the_copy_is_its_own():
    import copy

    model, plain = _packed_and_plain()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.mul_(0.5)
    _same_logits(model, plain)  # the original keeps its weights
    with torch.no_grad():
        plain.lm_head.weight.mul_(0.5)
    _same_logits(twin, plain)


def test_prepack_packs_for_the_batch_hint_asked_for(monkeypatch):
    seen = []
    real = torch.ops.mkldnn._reorder_linear_weight

    class Ops:
        @staticmethod
        def _reorder_linear_weight(w, hint):
            seen.append(hint)
            return real(w, hint)

        _linear_pointwise = torch.ops.mkldnn._linear_pointwise

    monkeypatch.setattr(torch.ops, "mkldnn", Ops)
    seq = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    assert prepack(seq, batch_hint=3) == (2, None)
    with torch.no_grad():
        seq[0].weight.add_(1.0)
    seq(torch.randn(1, 8))
    assert seen == [3, 3, 3]  # a repack keeps the hint too


def test_a_compiled_packed_layer_follows_its_weight():
    """A compiled graph calls the layer's current packing: an edit after compiling is seen."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    seq = torch.nn.Sequential(lin)
    prepack(seq)
    run = torch.compile(seq, backend="inductor", dynamic=False)
    x = torch.randn(3, 24)
    with torch.no_grad():
        run(x)
        lin.weight.mul_(-2.0)
        lin.bias.add_(1.0)
        torch.testing.assert_close(run(x), x @ lin.weight.T + lin.bias, atol=1e-5, rtol=1e-5)
        import copy

        twin = copy.deepcopy(seq)  # its own layer, found by its own slot
        twin[0].weight.mul_(0.5)
        twin_run = torch.compile(twin, backend="inductor", dynamic=False)
        torch.testing.assert_close(twin_run(x), x @ twin[0].weight.T + lin.bias, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(run(x), x @ lin.weight.T + lin.bias, atol=1e-5, rtol=1e-5)
