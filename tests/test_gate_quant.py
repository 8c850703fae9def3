"""A gate stored in 4 bits: the codes follow the rule written in `mars_core.gate_quant`'s docstring,
the stored form reads back within half a step of every value, and a model loaded from it still
computes the base bit for bit at every real position."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mars_core.gate import EMBEDDING, attach_gate, gate_state, load_gate, read_gate, save_gate
from mars_core.gate_quant import GROUP, dequantize, quantize
from test_frozen_layers import tiny_llama
from test_gate import MASK, _randomise


def test_codes_lo_step_and_nibble_order_are_the_documented_rule():
    # one group: 0, 1, ..., 63 times 0.5 (lo 0, max 31.5, step 2.1), then a constant group
    x = torch.cat([torch.arange(GROUP) * 0.5, torch.full((GROUP,), -3.0)]).reshape(2, GROUP)
    codes, lo, step = quantize(x)
    assert codes.dtype == torch.uint8 and codes.shape == (2, GROUP // 2)
    assert lo.tolist() == [0.0, -3.0] and step.dtype == torch.float16
    assert step[0].item() == pytest.approx(2.1, abs=1e-3) and step[1].item() == 0.0
    want = [min(15, round(v * 0.5 / step[0].item())) for v in range(GROUP)]  # written from the rule
    # byte i holds value 2i in its low nibble, 2i + 1 in its high nibble
    assert codes[0].tolist() == [want[2 * i] | (want[2 * i + 1] << 4) for i in range(GROUP // 2)]
    assert codes[0, 0].item() == 0 and codes[0, -1].item() == (want[-2] | 15 << 4)
    assert codes[1].tolist() == [0] * (GROUP // 2)
    back = dequantize(codes, lo, step)
    assert back[1].tolist() == [-3.0] * GROUP and back[0, -1].item() == pytest.approx(31.5, abs=1e-2)


@pytest.mark.parametrize("shape", [(16, 576), (576, 16), (4, 32)])
def test_every_value_reads_back_within_half_a_step(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * torch.rand(shape[0], 1, generator=g)  # groups of unlike ranges
    codes, lo, step = quantize(x)
    back = dequantize(codes, lo, step)
    assert back.shape == x.shape and back.dtype == torch.float32
    err = (back - x).abs().reshape(-1, GROUP)
    # half a step, plus the float16 rounding of lo and of lo + 15 steps
    bound = step.float()[:, None] / 2 + (x.abs().reshape(-1, GROUP).amax(1, keepdim=True) * 2 ** -10)
    assert (err <= bound).all()
    assert err.mean() > 0  # 4 bits do not hold a random tensor exactly: the test sees the rounding


def test_a_shape_that_cannot_take_4_bits_is_a_clear_error():
    with pytest.raises(ValueError, match="multiple of 64"):
        quantize(torch.zeros(3, 10))
    with pytest.raises(ValueError, match="malformed"):
        dequantize(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(3, dtype=torch.float16), torch.zeros(3, dtype=torch.float16))


@pytest.mark.parametrize("bad", [1e6, float("nan"), float("inf")])
def test_a_value_float16_cannot_hold_is_a_clear_error(bad):
    x = torch.zeros(2, GROUP)
    x[1, 3] = bad  # lo and step are float16: 1e6 would be stored as inf and read back as NaN
    with pytest.raises(ValueError, match="16 bits"):
        quantize(x)
    quantize(x.clamp(-6e4, 6e4).nan_to_num(0.0))  # inside float16's range it packs


def _gated(seed=1):
    model = tiny_llama()
    # rank 4 on a width-32 model: every adapter is 4 x 32 or 32 x 4 (and the MLP's 64-wide ones), whole groups
    _randomise(attach_gate(model, MASK, rank=4, trainable=True), seed=seed)
    return model


def test_a_4_bit_gate_loads_close_to_the_trained_one_and_real_positions_stay_the_base(tmp_path):
    model = _gated()
    path = str(tmp_path / "gate.safetensors")
    save_gate(model, path, dtype=torch.float32, bits=4)
    with safe_open(path, "pt") as f:
        assert f.metadata()["gate_storage"] == "q4g64"
        assert {f.get_tensor(k).dtype for k in f.keys() if k.endswith(".q4")} == {torch.uint8}
    state, mask_id = read_gate(path)
    trained = gate_state(model)
    assert mask_id == MASK and set(state) == set(trained)
    assert torch.equal(state[EMBEDDING], trained[EMBEDDING])  # the embedding is not quantized
    for k, v in trained.items():
        assert state[k].shape == v.shape and (state[k] - v).abs().amax() <= v.abs().amax() / 15 + 1e-6, k
    assert any(not torch.equal(state[k], trained[k]) for k in trained)
    loaded, base = tiny_llama(), tiny_llama()
    load_gate(loaded, path)
    ids = torch.tensor([[7, 9, 11, 13, MASK, MASK, MASK]])
    with torch.no_grad():
        got, want, plain = loaded(ids).logits, model(ids).logits, base(ids).logits
    assert torch.equal(got[:, :4], plain[:, :4])
    # masks: near the trained gate's output, far from the base's
    assert (got[:, 4:] - want[:, 4:]).abs().amax() < 0.25 * (want[:, 4:] - plain[:, 4:]).abs().amax()


def _stored_bytes(path) -> int:
    with safe_open(str(path), "pt") as f:
        return sum(f.get_tensor(k).nbytes for k in f.keys() if k != EMBEDDING)


def test_an_adapter_too_small_for_whole_groups_is_stored_as_it_is(tmp_path):
    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=1, trainable=True))  # A: 1 x 32 = 32 values, half a group
    path = str(tmp_path / "gate.safetensors")
    save_gate(model, path, dtype=torch.float32, bits=4)
    with safe_open(path, "pt") as f:
        plain = {k for k in f.keys() if not k.endswith((".q4", ".lo", ".step"))}
    assert "model.layers.0.self_attn.q_proj.weight.lora_a" in plain  # (1, 32): kept
    assert "model.layers.0.mlp.down_proj.weight.lora_a" not in plain  # (1, 64): packed
    state, _ = read_gate(path)
    trained = gate_state(model)
    assert set(state) == set(trained)
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight.lora_a"], trained["model.layers.0.self_attn.q_proj.weight.lora_a"])


def test_a_4_bit_file_is_smaller_and_an_unknown_storage_is_refused(tmp_path):
    model = _gated()
    save_gate(model, str(tmp_path / "q4.safetensors"), bits=4)
    save_gate(model, str(tmp_path / "bf16.safetensors"))
    # the tensors' bytes (a tiny model's file is mostly its header): 4.5 bits a value against 16
    assert _stored_bytes(tmp_path / "q4.safetensors") < 0.35 * _stored_bytes(tmp_path / "bf16.safetensors")
    with pytest.raises(ValueError, match="bits=8"):
        save_gate(model, str(tmp_path / "x.safetensors"), bits=8)
    state, _ = read_gate(str(tmp_path / "bf16.safetensors"))
    save_file(state, str(tmp_path / "q2.safetensors"), metadata={"format": "pt", "mask_token_id": "5", "gate_storage": "q2g32"})
    with pytest.raises(ValueError, match="q2g32"):
        read_gate(str(tmp_path / "q2.safetensors"))


def test_cut_rank_keeps_the_largest_singular_directions_of_each_adapter():
    """Oracle of its own: B @ A = U diag(s) V^T built from known orthonormal U, V and known s, so
    the best rank-2 approximation is U[:, :2] diag(s[:2]) V[:, :2]^T, whatever the split into A, B."""
    from training.gate_export import cut_rank

    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(12, 4, generator=g))  # (out, r) orthonormal columns
    v, _ = torch.linalg.qr(torch.randn(10, 4, generator=g))  # (in, r)
    s = torch.tensor([5.0, 3.0, 0.5, 0.25])
    b, a = u * s, v.T  # an unbalanced split: B carries the singular values
    gate = {"m.q_proj.lora_a": a, "m.q_proj.lora_b": b, "mask_embedding": torch.ones(3)}
    cut = cut_rank(gate, 2)
    want = u[:, :2] @ torch.diag(s[:2]) @ v[:, :2].T
    assert cut["m.q_proj.lora_a"].shape == (2, 10) and cut["m.q_proj.lora_b"].shape == (12, 2)
    assert torch.allclose(cut["m.q_proj.lora_b"] @ cut["m.q_proj.lora_a"], want, atol=1e-5)
    assert torch.equal(cut["mask_embedding"], gate["mask_embedding"])
    with pytest.raises(ValueError, match="rank 4: give a rank below that"):
        cut_rank(gate, 4)
