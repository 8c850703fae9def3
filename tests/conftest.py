"""Tiny random models and a tokenizer built in-process: CPU only, no downloads."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CORPUS = [
    "Tom has 12 apples and buys 30 more. How many apples does he have now? 12 + 30 = 42.",
    "A box holds 24 pens. 3 boxes hold 24 * 3 = 72 pens. The answer is 72.",
    "Sort the list 45, 12, 88, 31: 12, 31, 45, 88. Convert 3 km to m: 3000 m.",
    "Hello world, the quick brown fox jumps over the lazy dog. What is the sum?",
]
PROMPTS = [
    "Tom has 12 apples.",
    "Sort the list 45, 12, 88, 31, 7, 19, 23 and then tell me the sum of all numbers please.",
    "Hi",
    "What is 24 * 3?",
    "The quick brown fox jumps over the lazy dog and then the dog jumps over the fox again.",
    "Convert 3 km to m",
]


def make_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|mask|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>",
                                 mask_token="<|mask|>")
    hf.chat_template = CHAT
    return hf


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


def make_model(kind: str, vocab_size: int, seed: int = 0, head_scale: float = 1.0):
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.config._attn_implementation = "sdpa"
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model.float().eval()


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def model(request, tokenizer):
    m = make_model(request.param, len(tokenizer))
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    m.generation_config.pad_token_id = tokenizer.pad_token_id
    return m


@pytest.fixture(scope="session")
def confident_model(tokenizer):
    """A random Qwen2 whose LM head is scaled up so that it is often confident: MARS then
    accepts several tokens per step at ordinary tau."""
    m = make_model("qwen2", len(tokenizer), seed=1, head_scale=30.0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m
