"""oneDNN-prepacked linear layers (`mars_core.cpu.prepack`): same numbers, same weights, exact decoding."""
import os

import pytest
import torch

from conftest import make_model
from mars_core import DecodeConfig, generate, load_model
from mars_core.cpu import PackedLinear, prepack
from test_bundled_models import ROOT


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (2, 7, 24), (1, 1, 24)])
def test_packed_linear_computes_x_times_w_transposed_plus_b(bias, shape):
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40, bias=bias)
    seq = torch.nn.Sequential(lin)
    assert prepack(seq) == (1, None) and isinstance(seq[0], PackedLinear)
    x = torch.randn(*shape)
    with torch.no_grad():
        want = x @ lin.weight.T + (lin.bias if bias else 0)  # the rule, not nn.Linear's code
        got = seq(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_a_prepacked_model_gives_the_same_logits_and_keeps_its_weights(kind):
    model = make_model(kind, 96)
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    n, note = prepack(model)
    assert note is None and n == linears == sum(isinstance(m, PackedLinear) for m in model.modules())
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == before  # same keys, same tensors
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)


def test_a_prepacked_model_refuses_to_be_trained():
    model = make_model("llama", 96)
    prepack(model)
    model(input_ids=torch.tensor([[1, 2, 3]]))  # outside no_grad: fine, nothing asks for gradients
    model.requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference"):
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_packing_is_all_or_nothing():
    """bf16 packs only where oneDNN has the instructions for it; elsewhere nothing is swapped."""
    model = make_model("qwen2", 96).to(torch.bfloat16)
    n, note = prepack(model)
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    assert (n, packed, note) in ((0, 0, note), (7 * 2 + 1, 7 * 2 + 1, None))
    assert n or "bfloat16" in note


@pytest.mark.parametrize("mode", ["mars", "lossless"])
def test_decoding_a_prepacked_bundled_model(mode):
    """load_model(prepack=True): the lossless output is the packed model's own AR output, and tau 1
    is AR, on the bundled MARS model (trained, so its argmaxes are not near ties)."""
    path = os.path.join(ROOT, "tiny-mars-b4")
    model, tok = load_model(path, device="cpu", prepack=True)
    assert isinstance(model.lm_head, PackedLinear) and model.mars_dtype_note is None
    plain, _ = load_model(path, device="cpu")
    prompts = ["What is 17 + 25?", "Compute 3 * 14.", "Hi"]
    cfg = dict(block_size=4, max_new_tokens=40)
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **cfg))
    extra = dict(tau=1.0) if mode == "mars" else dict(prompt_lookup=2)
    res = generate(model, tok, prompts, DecodeConfig(mode=mode, **extra, **cfg))
    assert res.token_ids == ar.token_ids
    assert ar.token_ids == generate(plain, tok, prompts, DecodeConfig(mode="ar", **cfg)).token_ids
    assert res.stats.tokens_per_forward > 1.2 or mode == "mars"


def test_a_prepacked_model_compiles_and_keeps_onednn():
    """Under torch.compile a packed layer calls `mars::packed_linear`, an op inductor keeps as it is
    (it cannot lower oneDNN's op on a weight it did not pack, and with freezing it packs float32 for
    MKL, slow for 2+ rows); the compiled decode equals eager AR and does run the op."""
    model, tok = load_model(os.path.join(ROOT, "tiny-mars-b4"), device="cpu", prepack=True)
    prompts = ["What is 17 + 25?", "Hi"]
    cfg = dict(block_size=4, max_new_tokens=16, cache="cursor")
    eager = generate(model, tok, prompts, DecodeConfig(mode="ar", **cfg))
    compiled = DecodeConfig(mode="lossless", compile=True, **cfg)
    generate(model, tok, prompts, compiled)  # compile outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert generate(model, tok, prompts, compiled).token_ids == eager.token_ids
    calls = [e.count for e in prof.key_averages() if e.key == "mars::packed_linear"]
    assert calls and calls[0] >= sum(isinstance(m, PackedLinear) for m in model.modules())


def test_the_app_store_prepacks_cpu_models_it_does_not_quantise_where_it_pays():
    from playground.models import ModelStore

    asked = []

    def loader(source, **kw):
        asked.append(kw["prepack"])
        return object(), object()

    ModelStore(device="cpu", loader=loader).get("a")
    ModelStore(device="cpu", loader=loader).get("a", "8bit")
    ModelStore(device="cpu", loader=loader, prepack=False).get("a")
    ModelStore(device="cuda", loader=loader).get("a")
    assert asked == ["auto", False, False, False]


def _timings(monkeypatch, plain, packed):
    """kernel_choice's timer, scripted: `plain` seconds a round for plain layers, `packed` for packed."""
    from mars_core import kernel_choice

    def timed(model, batch, context, repeats, widths):
        is_packed = any(isinstance(m, PackedLinear) for m in model.modules())
        return {w: (packed if is_packed else plain) for w in widths}

    monkeypatch.setattr(kernel_choice, "timed_widths", timed)


@pytest.mark.parametrize("plain,packed,want", [(1.0, 0.5, True), (1.0, 2.0, False), (1.0, 0.99, False)])
def test_auto_packs_only_where_packed_forwards_measure_faster(monkeypatch, tmp_path, plain, packed, want):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    _timings(monkeypatch, plain, packed)
    from mars_core.kernel_choice import choose_prepack

    model = make_model("llama", 96)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    weights = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert choose_prepack(model) == (want, None)
    assert any(isinstance(m, PackedLinear) for m in model.modules()) == want
    assert all(type(m) is not PackedLinear for m in model.modules()) != want
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == weights  # the same Parameters
    assert all(p.requires_grad for p in model.parameters()) != want  # a plain model is left trainable
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before, atol=1e-4, rtol=1e-4)


def test_auto_measures_once_per_machine_and_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    from mars_core import kernel_choice

    calls = []
    real = kernel_choice.measure
    monkeypatch.setattr(kernel_choice, "measure", lambda m: calls.append(1) or real(m, repeats=1))
    for _ in range(2):
        kernel_choice.choose_prepack(make_model("llama", 96))
    assert len(calls) == 1
    kernel_choice.choose_prepack(make_model("llama", 96).to(torch.float64))  # another dtype: measured again
    assert len(calls) == 2


def test_load_model_refuses_an_unknown_prepack():
    with pytest.raises(ValueError, match="prepack must be True, False or 'auto'"):
        load_model(os.path.join(ROOT, "assets", "models", "tiny-mars"), prepack="yes")


def test_auto_leaves_a_packed_model_packed(monkeypatch, tmp_path):
    """Timing a packed model "plain" would time its packed layers, then unpack it on the way out."""
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    _timings(monkeypatch, plain=1.0, packed=2.0)
    from mars_core.kernel_choice import apply_prepack

    model = make_model("llama", 96)
    assert apply_prepack(model, True) is None
    assert apply_prepack(model, "auto") is None
    assert any(isinstance(m, PackedLinear) for m in model.modules())
