"""LoRA continuation of a frozen-layers run: the adapters, the merged snapshot, resume, shipping on
exactly the delta it was trained on."""
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mars_core.packaged import delta_tensors, ensure_derived
from test_frozen_layers import _distill_file, tiny_llama, tiny_model_dir  # noqa: F401 (fixture)
from test_frozen_stage import oracle, refused, write_data
from training.delta import main as delta_main
from training.frozen_stage import main
from training.lora import LoRALinear, add_lora, adapter_state, load_adapter_state, merged_layers


def _perturb(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_untrained_adapters_leave_the_model_as_it_was_and_merging_matches_the_wrapped_forward():
    model, plain = tiny_llama(), tiny_llama()
    x = torch.randint(0, 64, (1, 9))
    params = add_lora(model, 2, rank=3, alpha=6.0)
    assert len(params) == 2 * 7 * 2  # A and B of 7 matrices in each of the top 2 layers
    torch.testing.assert_close(model(x).logits, plain(x).logits, rtol=0, atol=0)  # B = 0
    _perturb(params)
    merged = merged_layers(model, 2)
    assert set(merged) == {k for k in plain.state_dict() if k.startswith(("model.layers.2.", "model.layers.3."))}
    plain.load_state_dict(merged, strict=False)
    torch.testing.assert_close(model(x).logits, plain(x).logits, rtol=1e-5, atol=1e-5)


def test_adapter_state_is_the_increment_with_the_scale_folded_in():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _perturb(add_lora(model, 3, rank=2, alpha=5.0))
    state, merged = adapter_state(model), merged_layers(model, 3)
    key = "model.layers.3.mlp.down_proj.weight"
    a, b = state[key + ".lora_a"], state[key + ".lora_b"]
    assert a.shape == (2, 64) and b.shape == (32, 2)
    torch.testing.assert_close(b @ a, merged[key] - before[key])  # the scale (2.5) is in b
    assert torch.linalg.matrix_rank(merged[key] - before[key]) == 2
    other = tiny_llama(seed=5)
    add_lora(other, 3, rank=2, alpha=5.0)
    load_adapter_state(other, state)
    torch.testing.assert_close(adapter_state(other)[key + ".lora_b"], b)
    wrong = tiny_llama()
    add_lora(wrong, 3, rank=4, alpha=5.0)
    with pytest.raises(ValueError, match="rank 2"):
        load_adapter_state(wrong, state)


def test_a_lora_layer_is_its_rule():
    """W x + b + (alpha / r) B A x; B starts at zero; the wrapped weight is frozen."""
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5)
    layer = LoRALinear(base, rank=2, alpha=5.0)
    assert torch.equal(layer.lora_b, torch.zeros(5, 2)) and not base.weight.requires_grad
    with torch.no_grad():
        layer.lora_b.copy_(torch.randn(5, 2))
    x = torch.randn(3, 6)
    want = x @ base.weight.T + base.bias + 2.5 * (x @ layer.lora_a.T) @ layer.lora_b.T
    torch.testing.assert_close(layer(x), want)
    torch.testing.assert_close(layer.delta(), 2.5 * layer.lora_b @ layer.lora_a)
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(base, rank=0, alpha=1.0)


def test_delta_tensors_refuses_half_a_low_rank_pair():
    a, b = torch.ones(2, 3), torch.ones(4, 2)
    torch.testing.assert_close(delta_tensors({"w.lora_a": a, "w.lora_b": b})["w"], b @ a)
    with pytest.raises(ValueError, match="without 'w.lora_a'"):
        delta_tensors({"w.lora_b": b})
    with pytest.raises(ValueError, match="w.lora_b"):
        delta_tensors({"w.lora_a": a})


def _full_run_and_its_delta(tmp_path, model_dir, tokenizer):
    """A full run, and the folder that ships it (its int8 delta)."""
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    common = ["--base", model_dir, "--data", str(data), "--accum", "3", "--warmup", "1", "--train-layers", "1"]
    assert main(common + ["--out", str(tmp_path / "full"), "--epochs", "1", "--lr", "1e-2"]) == 0
    assert delta_main([str(tmp_path / "full" / "latest.pt"), str(tmp_path / "ship"), "--base", model_dir]) == 0
    return data, common


def _shipped_weights(tmp_path, model_dir, folder, name="shipped"):
    """What `load_model` of the fine-tune gives: `mars_core.packaged` adds the folder's files to the base."""
    return ensure_derived(name, Path(model_dir), Path(folder), root=tmp_path / "cache")


def test_a_lora_stage_trains_on_exactly_what_ships(tmp_path, tiny_model_dir, tokenizer):
    data, common = _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    delta = str(tmp_path / "ship" / "delta.safetensors")
    opts = dict(train_layers=1, accum=3, warmup=1, lr=1e-2, epochs=2, seed=1)
    lora = ["--init", delta, "--lora-rank", "2", "--lora-alpha", "6", "--seed", "1", "--lr", "1e-2", "--epochs", "2"]
    assert main(common + lora + ["--out", str(tmp_path / "lora")]) == 0
    saved = torch.load(tmp_path / "lora" / "latest.pt")
    shipped = _shipped_weights(tmp_path, tiny_model_dir, tmp_path / "ship")
    want = oracle(str(shipped), data, saved["state"]["step"], lora=(2, 6.0), **opts)
    for key, value in adapter_state(want).items():
        torch.testing.assert_close(saved["lora"][key], value, rtol=0, atol=1e-7, msg=key)
    for key, value in merged_layers(want, 1).items():
        torch.testing.assert_close(saved["layers"][key], value, rtol=0, atol=1e-7, msg=key)
    # lr 0: the adapters stay zero, so the snapshot is the shipped model itself, not the fp32 run
    assert main(common + lora[:-4] + ["--lr", "0", "--max-steps", "1", "--out", str(tmp_path / "still")]) == 0
    still = torch.load(tmp_path / "still" / "latest.pt")["layers"]
    ships, fp32 = load_file(shipped / "model.safetensors"), torch.load(tmp_path / "full" / "latest.pt")["layers"]
    assert all(torch.equal(v, ships[k]) for k, v in still.items())
    assert any(not torch.equal(v, fp32[k]) for k, v in still.items())  # int8 rounding moved them


def test_a_lora_continuation_of_fp32_layers_is_refused(tmp_path, tiny_model_dir, tokenizer, capsys):
    _, common = _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    init = str(tmp_path / "full" / "latest.pt")
    assert refused(common + ["--init", init, "--lora-rank", "2", "--out", str(tmp_path / "lora")])
    assert "delta.safetensors" in capsys.readouterr().out and not os.path.exists(tmp_path / "lora" / "latest.pt")
    # a full continuation of fp32 layers ships its own full delta: allowed
    assert main(common + ["--init", init, "--max-steps", "1", "--out", str(tmp_path / "more")]) == 0


def test_a_lora_stage_resumes_exactly_and_ships_beside_its_delta(tmp_path, tiny_model_dir, tokenizer):
    _, common = _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    lora = common + ["--init", str(tmp_path / "ship" / "delta.safetensors"), "--lora-rank", "2", "--lr", "1e-2",
                     "--epochs", "2"]
    assert main(lora + ["--out", str(tmp_path / "once")]) == 0
    assert main(lora + ["--out", str(tmp_path / "twice"), "--max-steps", "2"]) == 0
    assert main(lora + ["--out", str(tmp_path / "twice")]) == 0  # resumes: init again, then the adapters
    once, twice = torch.load(tmp_path / "once" / "latest.pt"), torch.load(tmp_path / "twice" / "latest.pt")
    start = load_file(_shipped_weights(tmp_path, tiny_model_dir, tmp_path / "ship") / "model.safetensors")
    assert once["state"]["step"] == twice["state"]["step"] == 6  # 7 examples, 3 a step, 2 epochs
    for key, value in once["layers"].items():
        torch.testing.assert_close(twice["layers"][key], value, rtol=0, atol=0)
    key = "model.layers.1.self_attn.q_proj.weight"
    increment = once["layers"][key] - start[key]
    assert increment.abs().max() > 0 and torch.linalg.matrix_rank(increment) <= 2
    norm = "model.layers.1.input_layernorm.weight"  # not adapted: exactly the shipped model's
    assert torch.equal(once["layers"][norm], start[norm])
    # a resume on another delta than the one it started on is refused
    shutil.copy(tmp_path / "ship" / "delta.safetensors", tmp_path / "kept.safetensors")
    assert delta_main([str(tmp_path / "full" / "latest.pt"), str(tmp_path / "ship"), "--base", tiny_model_dir,
                       "--format", "bf16"]) == 0
    assert refused(lora + ["--out", str(tmp_path / "twice")])
    shutil.copy(tmp_path / "kept.safetensors", tmp_path / "ship" / "delta.safetensors")
    # a LoRA run is not resumed as a full one, nor the other way round
    assert refused(common + ["--epochs", "2", "--out", str(tmp_path / "once")])
    assert refused(common + ["--lora-rank", "2", "--epochs", "2", "--out", str(tmp_path / "full")])
    # shipped beside its delta: the adapters in bf16; load_model's model is the snapshot up to bf16
    assert delta_main([str(tmp_path / "once" / "latest.pt"), str(tmp_path / "ship"), "--lora"]) == 0
    shipped = load_file(tmp_path / "ship" / "lora.safetensors")
    assert shipped[key + ".lora_a"].dtype == torch.bfloat16
    with_lora = load_file(_shipped_weights(tmp_path, tiny_model_dir, tmp_path / "ship", "pair") / "model.safetensors")
    for k, v in once["layers"].items():
        err = (with_lora[k] - v).norm() / max((v - start[k]).norm(), 1e-12)
        assert err < 0.01 or torch.equal(v, start[k]), k  # bf16 keeps 8 bits of each factor


def test_adapters_ship_only_beside_the_delta_they_were_trained_on(tmp_path, tiny_model_dir, tokenizer, capsys):
    _, common = _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    init = str(tmp_path / "ship" / "delta.safetensors")
    assert main(common + ["--init", init, "--lora-rank", "2", "--max-steps", "1", "--out", str(tmp_path / "lora")]) == 0
    snap = str(tmp_path / "lora" / "latest.pt")
    assert refused([snap, str(tmp_path / "elsewhere"), "--lora"], delta_main)  # no delta under them there
    assert delta_main([str(tmp_path / "full" / "latest.pt"), str(tmp_path / "other"), "--base", tiny_model_dir,
                       "--format", "bf16"]) == 0
    assert refused([snap, str(tmp_path / "other"), "--lora"], delta_main)  # another delta (the bf16 one) under them
    assert "another delta" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "other" / "lora.safetensors")
    # a snapshot of the old kind (adapters on fp32 layers, no record of a delta) is refused
    old = torch.load(snap)
    del old["state"]["init_sha256"]
    torch.save(old, tmp_path / "old.pt")
    assert refused([str(tmp_path / "old.pt"), str(tmp_path / "ship"), "--lora"], delta_main)
    assert delta_main([snap, str(tmp_path / "ship"), "--lora"]) == 0
    # a new full delta over adapters trained on the old one is refused
    assert refused([str(tmp_path / "full" / "latest.pt"), str(tmp_path / "ship"), "--base", tiny_model_dir], delta_main)
    assert refused([str(tmp_path / "full" / "latest.pt"), str(tmp_path / "ship2"), "--lora"], delta_main)  # no adapters


def test_a_shipped_delta_as_init_must_fit_the_run(tmp_path, tiny_model_dir, tokenizer, capsys):
    data, common = _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    both = ["--base", tiny_model_dir, "--data", str(data), "--train-layers", "2", "--max-steps", "1"]
    ship = str(tmp_path / "ship" / "delta.safetensors")
    assert main(both + ["--init", ship, "--out", str(tmp_path / "a")]) == 0  # its layer 1 is among layers 0..1
    layer0 = {"model.layers.0.mlp.up_proj.weight": torch.ones(128, 64, dtype=torch.bfloat16)}
    save_file(layer0, tmp_path / "low.safetensors", metadata={"format": "bf16"})
    assert refused(common + ["--init", str(tmp_path / "low.safetensors"), "--out", str(tmp_path / "b")])
    assert "outside the layers" in capsys.readouterr().out
    save_file(layer0, tmp_path / "other.safetensors", metadata={"format": "bf16", "base": "smollm2-135m-instruct"})
    assert refused(both + ["--init", str(tmp_path / "other.safetensors"), "--out", str(tmp_path / "c")])
    assert "--base" in capsys.readouterr().out
    assert main(common + ["--init", ship, "--lora-rank", "2", "--max-steps", "1", "--out", str(tmp_path / "d")]) == 0
    assert delta_main([str(tmp_path / "d" / "latest.pt"), str(tmp_path / "ship"), "--lora"]) == 0
    adapters = str(tmp_path / "ship" / "lora.safetensors")
    assert refused(common + ["--init", adapters, "--lora-rank", "2", "--out", str(tmp_path / "e")])
    assert "adapters" in capsys.readouterr().out


def test_the_clock_continues_through_a_delta(tmp_path, tiny_model_dir, tokenizer):
    from safetensors import safe_open

    data, common = _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    full = torch.load(tmp_path / "full" / "latest.pt")
    full["state"]["minutes"] = 100.0  # as if it had trained 100 minutes
    torch.save(full, tmp_path / "full100.pt")
    assert delta_main([str(tmp_path / "full100.pt"), str(tmp_path / "s100"), "--base", tiny_model_dir]) == 0
    with safe_open(str(tmp_path / "s100" / "delta.safetensors"), "pt") as f:
        assert f.metadata()["minutes"] == "100.0"
    init = ["--init", str(tmp_path / "s100" / "delta.safetensors"), "--max-steps", "1"]
    assert main(common + init + ["--lora-rank", "2", "--out", str(tmp_path / "l")]) == 0
    assert 100.0 <= torch.load(tmp_path / "l" / "latest.pt")["state"]["minutes"] < 101.0


def test_training_delta_writes_the_format_asked_for_on_the_base_asked_for(tmp_path, tiny_model_dir, tokenizer):
    _full_run_and_its_delta(tmp_path, tiny_model_dir, tokenizer)
    layers = torch.load(tmp_path / "full" / "latest.pt")["layers"]
    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert delta_main([str(tmp_path / "full" / "latest.pt"), str(tmp_path / "b"), "--base", tiny_model_dir,
                       "--format", "bf16"]) == 0
    int8, bf16 = load_file(tmp_path / "ship" / "delta.safetensors"), load_file(tmp_path / "b" / "delta.safetensors")
    key = "model.layers.1.mlp.down_proj.weight"
    assert int8[key].dtype == torch.int8 and bf16[key].dtype == torch.bfloat16 and key + ".row_scale" not in bf16
    for stored, tol in ((int8, 0.5), (bf16, 2 ** -8)):
        d = delta_tensors(stored)[key]
        moved = layers[key] - base[key]
        step = moved.abs().amax(dim=1, keepdim=True) / 127 if tol == 0.5 else moved.abs()
        assert ((d - moved).abs() <= tol * step + 1e-9).all()  # half an int8 step a row; bf16's 8 bits
