"""Loading: released-checkpoint layout (a2d-qwen2), mask token, 8-bit on CPU, and bad input."""
import json

import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, generate, load_model


def save(tmp_path, tokenizer, model_type=None, with_mask=True):
    model = make_model("qwen2", len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    if not with_mask:  # a tokenizer folder that has never heard of a mask token
        cfg_path = tmp_path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("mask_token", None)
        cfg_path.write_text(json.dumps(cfg))
    if model_type:
        cfg_path = tmp_path / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model_type"] = model_type
        cfg["architectures"] = ["A2DQwen2LMHeadModel"]
        cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_a2d.A2DQwen2LMHeadModel"}
        cfg_path.write_text(json.dumps(cfg))
    return model


def test_a2d_qwen2_checkpoint_loads_without_remote_code(tmp_path, tokenizer):
    original = save(tmp_path, tokenizer, model_type="a2d-qwen2")
    model, tok = load_model(str(tmp_path), device="cpu")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config._attn_implementation == "sdpa" and model.dtype == torch.float32
    assert tok.mask_token == "<|mask|>"
    for a, b in zip(original.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    res = generate(model, tok, PROMPTS[:2], DecodeConfig(tau=0.9, max_new_tokens=8))
    assert all(len(t) > 0 for t in res.token_ids)


def test_missing_mask_token_is_added_and_embeddings_grow(tmp_path):
    from conftest import make_tokenizer
    from tokenizers import Tokenizer
    tok = make_tokenizer()
    # rebuild a tokenizer whose vocabulary lacks <|mask|> entirely
    raw = json.loads(tok.backend_tokenizer.to_str())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != "<|mask|>"]
    raw["model"]["vocab"].pop("<|mask|>")
    vocab = raw["model"]["vocab"]
    for i, k in enumerate(sorted(vocab, key=vocab.get)):
        vocab[k] = i
    from transformers import PreTrainedTokenizerFast
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(raw)),
                                   eos_token="<|end|>", pad_token="<|pad|>")
    model = make_model("llama", len(bare))
    model.save_pretrained(tmp_path)
    bare.save_pretrained(tmp_path)
    loaded, t2 = load_model(str(tmp_path), device="cpu")
    assert t2.mask_token == "<|mask|>" and t2.mask_token_id == len(bare)
    assert loaded.get_input_embeddings().weight.shape[0] == len(bare) + 1


@pytest.mark.parametrize("quantization,layer,footprint,cosine", [("8bit", "Linear8bitLt", 0.6, 0.999),
                                                                   ("4bit", "Linear4bit", 0.5, 0.98)])
def test_quantized_loading_is_quantized_and_keeps_the_model(tmp_path, tokenizer, quantization, layer, footprint, cosine):
    """Every linear layer of the blocks is bitsandbytes', the model is smaller, its logits stay
    those of the full-precision model (a load with the wrong or random weights would not), and
    decoding runs: MARS at tau 1 equals AR on the quantized model."""
    pytest.importorskip("bitsandbytes")
    save(tmp_path, tokenizer)
    full, _ = load_model(str(tmp_path), device="cpu")
    model, tok = load_model(str(tmp_path), device="cpu", quantization=quantization)
    blocks = [m for name, m in model.named_modules() if ".layers." in name and isinstance(m, torch.nn.Linear)]
    assert blocks and all(type(m).__name__ == layer for m in blocks), {type(m).__name__ for m in blocks}
    assert model.get_memory_footprint() < footprint * full.get_memory_footprint()
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    with torch.no_grad():
        a, b = full(input_ids=ids).logits.flatten(), model(input_ids=ids).logits.float().flatten()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > cosine
    ar = generate(model, tok, PROMPTS[:2], DecodeConfig(mode="ar", max_new_tokens=6, cache="cursor"))
    strict = generate(model, tok, PROMPTS[:2], DecodeConfig(tau=1.0, max_new_tokens=6, cache="cursor"))
    assert ar.token_ids == strict.token_ids and all(ar.token_ids)


@pytest.mark.parametrize("path,match", [
    ("/no/such/folder", "does not exist"),
    ("./missing-model", "does not exist"),
    ("a/b/c", "does not exist"),
    ("", "non-empty"),
])
def test_bad_model_paths(path, match):
    with pytest.raises(ValueError, match=match):
        load_model(path, device="cpu")


def test_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_model(str(tmp_path), device="cpu")


def test_hub_id_without_network_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="could not load model"):
        load_model("nobody-xyz/not-a-model", device="cpu")


def test_bad_quantization(tmp_path, tokenizer):
    save(tmp_path, tokenizer)
    with pytest.raises(ValueError, match="quantization"):
        load_model(str(tmp_path), device="cpu", quantization="3bit")


def test_a_saved_tokenizer_comes_back_as_itself(tmp_path, tokenizer):
    """AutoTokenizer would rebuild a qwen2 folder's tokenizer as Qwen2Tokenizer (other
    pre-tokenizer, extra specials); the loader keeps the class the folder declares."""
    save(tmp_path, tokenizer)
    _, tok = load_model(str(tmp_path), device="cpu")
    assert len(tok) == len(tokenizer) and type(tok).__name__ == type(tokenizer).__name__
    text = "Tom has 12 apples. <|end|>"
    assert tok(text)["input_ids"] == tokenizer(text)["input_ids"]
