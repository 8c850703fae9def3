"""LoRA continuation of a frozen-layers run: the adapters, the merged snapshot, resume, shipping."""
import os

import pytest
import torch
from safetensors.torch import load_file

from test_frozen_layers import _distill_file, tiny_llama, tiny_model_dir  # noqa: F401 (fixture)
from training.lora import add_lora, adapter_state, load_adapter_state, merged_layers


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


def test_a_lora_stage_continues_a_run_resumes_exactly_and_ships_as_lora_safetensors(tmp_path, tiny_model_dir, tokenizer):
    from training.delta import main as delta_main
    from training.frozen_stage import main

    data = tmp_path / "d.jsonl"
    _distill_file(data, tokenizer)
    common = ["--base", tiny_model_dir, "--data", str(data), "--accum", "2", "--warmup", "1", "--train-layers", "1"]
    assert main(common + ["--out", str(tmp_path / "full"), "--epochs", "1", "--lr", "1e-3"]) == 0
    init = str(tmp_path / "full" / "latest.pt")
    lora = common + ["--init", init, "--lora-rank", "2", "--lr", "1e-2", "--epochs", "2"]
    assert main(lora + ["--out", str(tmp_path / "once")]) == 0
    assert main(lora + ["--out", str(tmp_path / "twice"), "--max-steps", "2"]) == 0
    assert main(lora + ["--out", str(tmp_path / "twice")]) == 0  # resumes: init again, then the adapters
    once, twice = torch.load(tmp_path / "once" / "latest.pt"), torch.load(tmp_path / "twice" / "latest.pt")
    start = torch.load(init)["layers"]
    assert once["state"]["step"] == twice["state"]["step"] == 6
    for key, value in once["layers"].items():
        torch.testing.assert_close(twice["layers"][key], value, rtol=0, atol=0)
    key = "model.layers.1.self_attn.q_proj.weight"
    increment = once["layers"][key] - start[key]
    assert increment.abs().max() > 0 and torch.linalg.matrix_rank(increment) <= 2
    norm = "model.layers.1.input_layernorm.weight"  # not adapted: exactly the run it continued
    assert torch.equal(once["layers"][norm], start[norm])
    # a LoRA run is not resumed as a full one, nor the other way round
    assert main(common + ["--init", init, "--epochs", "2", "--out", str(tmp_path / "once")]) == 2
    assert main(common + ["--lora-rank", "2", "--epochs", "2", "--out", str(tmp_path / "full")]) == 2
    # shipped: the adapters in bf16, whose product is the increment the snapshot merged
    assert delta_main([str(tmp_path / "once" / "latest.pt"), str(tmp_path / "ship"), "--lora"]) == 0
    shipped = load_file(tmp_path / "ship" / "lora.safetensors")
    assert shipped[key + ".lora_a"].dtype == torch.bfloat16
    product = shipped[key + ".lora_b"].float() @ shipped[key + ".lora_a"].float()
    assert (product - increment).norm() / increment.norm() < 0.01  # bf16 keeps 8 bits of each factor
    assert delta_main([init, str(tmp_path / "ship2"), "--lora"]) == 2  # a full run has no adapters
    assert not os.path.exists(tmp_path / "ship2" / "lora.safetensors")
