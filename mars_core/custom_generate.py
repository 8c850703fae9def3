"""MARS as a transformers decoding method: `model.generate(**inputs, custom_generate=...)`.

Two entry points, one decoding loop:

- `mars_decoding` is a callable for `custom_generate=`: `GenerationMixin.generate` prepares the
  inputs and the generation config, then hands the loop its usual arguments plus the keys of our
  signature (`tau`, `block_size`, ...)::

      model.generate(**inputs, custom_generate=mars_decoding, mask_token_id=tok.mask_token_id, tau=0.95)

- `generate` is the entry point of a Hub folder's `custom_generate/generate.py`
  (`python -m mars_core.export` writes this module there under that name, with the modules it
  needs): ``model.generate(**inputs, custom_generate="owner/model", trust_remote_code=True)``.

Settings come from the call, else from the generation config's `mars` entry (an exported folder
writes its defaults there), else from `DecodeConfig`. The decoding runs on the decoders a Hub
folder carries (`decoders.CORE`): the cursor cache (`kv_cache="cursor"`, the default) and the
no-cache reference (`kv_cache="none"`); every mode but "spec" (it needs a draft model).
`mode="lossless"` returns greedy `generate`'s tokens exactly, several per forward, with any
draft shape (`draft_groups`, `draft_tree`, `draft_budget`, `prompt_lookup`):
`generate_kwargs(fastest_exact(model, tok))` gives the fastest exact one on this machine as keywords. A mask-gated
checkpoint (its generation config's `mars` says `gated`) gets its `gate.safetensors` attached
here on first use (`gate.ensure_gate`): a stock load reads the base's weights only. What
`generate` returns: the sequences (prompt, new tokens with the EOS that ended a row, padding
after it), or with `return_dict_in_generate=True` a `MarsGenerateOutput` that adds
`accept_counts` (forwards, batch): the tokens each row accepted in each forward, 0 where the row
was not decoding.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin
from transformers.utils import logging

from .config import DecodeConfig, TauControl
from .decoders import CORE, start
from .gate import GATE_FILE, ensure_gate

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedModel
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

logger = logging.get_logger(__name__)

# generate(...) keyword -> DecodeConfig field (`cache` is taken: generate's own KV cache argument)
SETTINGS = {"mode": "mode", "tau": "tau", "block_size": "block_size", "metric": "metric",
            "kv_cache": "cache", "cache_block_size": "cache_block_size", "max_accept": "max_accept",
            "repeat_guard": "repeat_guard", "draft_groups": "draft_groups", "draft_tree": "draft_tree",
            "draft_budget": "draft_budget",
            "prompt_lookup": "prompt_lookup", "prompt_lookup_tokens": "prompt_lookup_tokens"}
UNSUPPORTED = {"num_beams": 1, "output_scores": False, "output_logits": False, "output_attentions": False,
               "output_hidden_states": False}


@dataclass
class MarsGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus accept_counts (forwards, batch) long: the tokens each
    sequence accepted in each forward (EOS-only steps count 1; 0: the sequence was not decoding)."""

    accept_counts: torch.LongTensor | None = None


@dataclass
class _SpecialIds:
    """The ids `decoders.start` reads from a tokenizer; generate() hands the loop ids, not a tokenizer."""

    mask_token_id: int
    pad_token_id: int
    eos_token_id: list[int]
    unk_token_id: None = None


def mars_decoding(model: PreTrainedModel, input_ids: torch.LongTensor,
                  logits_processor: LogitsProcessorList | None = None,
                  stopping_criteria: StoppingCriteriaList | None = None,
                  generation_config: GenerationConfig | None = None, synced_gpus: bool = False,
                  streamer: BaseStreamer | None = None, *, mode: str | None = None,
                  tau: float | None = None, block_size: int | None = None, metric: str | None = None,
                  kv_cache: str | None = None, cache_block_size: int | None = None,
                  max_accept: int | None = None, repeat_guard: bool | None = None,
                  draft_groups: str | None = None,
                  draft_tree: tuple[int, ...] | None = None, draft_budget: tuple[int, int] | None = None,
                  prompt_lookup: int | None = None, prompt_lookup_tokens: int | None = None,
                  seed: int | None = None, mask_token_id: int | None = None,
                  tau_control: TauControl | None = None, **model_kwargs: Any) -> torch.LongTensor | MarsGenerateOutput:
    """The MARS decoding loop. input_ids (B, L), left-padded per `attention_mask` (B, L).

    Returns sequences (B, L + new) long, or a `MarsGenerateOutput` when the generation config
    asks for `return_dict_in_generate`. Raises ValueError for settings MARS cannot honour.
    """
    if streamer is None:
        streamer = _streamer_of_generate()
    gc = generation_config if generation_config is not None else model.generation_config
    _check_request(model, gc, synced_gpus, logits_processor, stopping_criteria)
    given = dict(mode=mode, tau=tau, block_size=block_size, metric=metric, kv_cache=kv_cache,
                 cache_block_size=cache_block_size, max_accept=max_accept, repeat_guard=repeat_guard,
                 draft_groups=draft_groups, draft_tree=draft_tree, draft_budget=draft_budget,
                 prompt_lookup=prompt_lookup,
                 prompt_lookup_tokens=prompt_lookup_tokens, mask_token_id=mask_token_id)
    config, mask_id = _decode_config(model, gc, input_ids, given, seed, tau_control)
    if _defaults(model, gc).get("gated") and not ensure_gate(model):
        raise ValueError(f"this MARS checkpoint is mask-gated: its masks need {GATE_FILE} beside the weights "
                         "(model.config.name_or_path has none); without it the model is the base, whose masks "
                         "are untrained")
    prompts = _prompts(input_ids, model_kwargs.get("attention_mask"))
    if streamer is not None and len(prompts) > 1:
        raise ValueError(f"a streamer needs a batch of one; got {len(prompts)} sequences")
    eos = [] if gc._eos_token_tensor is None else gc._eos_token_tensor.reshape(-1).tolist()
    pad = int(gc._pad_token_tensor) if gc._pad_token_tensor is not None else (eos[0] if eos else 0)
    rows, steps = start(model, _SpecialIds(mask_id, pad, eos), prompts, config, tau_control, None, CORE)
    for event in steps:
        if streamer is not None:  # one put per forward: the tokens it accepted, and its EOS
            stop = [rows.stop_token[0]] if rows.stop_token[0] is not None and event.finished[0] else []
            streamer.put(torch.tensor(event.tokens[0] + stop, dtype=torch.long))
    if streamer is not None:
        streamer.end()
    new = [out + ([stop] if stop is not None else []) for out, stop in zip(rows.out, rows.stop_token)]
    width = max(len(n) for n in new)
    tail = torch.tensor([n + [pad] * (width - len(n)) for n in new], dtype=torch.long).reshape(len(new), width)
    sequences = torch.cat([input_ids, tail.to(input_ids.device)], dim=1)
    if not gc.return_dict_in_generate:
        return sequences
    counts = torch.tensor(rows.stats.accepted_per_step, dtype=torch.long).reshape(-1, len(new))
    return MarsGenerateOutput(sequences=sequences, accept_counts=counts)


def generate_kwargs(config: DecodeConfig) -> dict:
    """The keyword arguments that make `model.generate(..., custom_generate=...)` decode as `config`
    does (for instance `mars_core.fastest_exact`'s configuration): every setting above that differs
    from DecodeConfig's default; sampling and the token budget stay `generate`'s own arguments."""
    base = DecodeConfig()
    return {key: getattr(config, name) for key, name in SETTINGS.items()
            if getattr(config, name) != getattr(base, name)}


def generate(*args: Any, model: PreTrainedModel, **kwargs: Any) -> torch.LongTensor | MarsGenerateOutput:
    """Entry point of a Hub folder's `custom_generate/generate.py`: `generate`'s own input
    preparation, then `mars_decoding`. Also what `model.generate` becomes when a folder with this
    file is loaded with `trust_remote_code=True`."""
    kwargs.pop("custom_generate", None)  # present when called through that overridden model.generate
    kwargs.pop("trust_remote_code", None)
    return GenerationMixin.generate(model, *args, custom_generate=mars_decoding, **kwargs)


def _streamer_of_generate() -> BaseStreamer | None:
    """The `streamer` given to `generate`. transformers 5.24 does not pass it on to a callable
    `custom_generate` (`_extract_generation_mode_kwargs` keeps only the callable's own new keys),
    although `generate` has already `put` the prompt into it; without this the stream is silently lost."""
    frame = sys._getframe(2)  # mars_decoding's caller
    code = frame.f_code
    if code.co_name == "generate" and code.co_filename.endswith(os.path.join("generation", "utils.py")):
        return frame.f_locals.get("streamer")
    return None


def _check_request(model: PreTrainedModel, gc: GenerationConfig, synced_gpus: bool,
                   logits_processor: LogitsProcessorList | None, stopping_criteria: StoppingCriteriaList | None) -> None:
    if synced_gpus:
        raise ValueError("MARS decoding does not support synced_gpus (DeepSpeed ZeRO-3 / FSDP generation)")
    for name, default in UNSUPPORTED.items():
        if getattr(gc, name, default) not in (default, None):
            raise ValueError(f"MARS decoding does not support {name}={getattr(gc, name)!r} (allowed: {default!r})")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("MARS decoding needs a decoder-only causal LM")
    odd = [type(c).__name__ for c in stopping_criteria or [] if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    if odd:
        raise ValueError(f"MARS decoding stops at EOS or max_new_tokens only; unsupported stopping criteria: {odd}")
    ignored = [type(p).__name__ for p in logits_processor or [] if not isinstance(p, TemperatureLogitsWarper)]
    if ignored:
        logger.warning_once(f"MARS decoding samples with temperature only; ignored: {', '.join(ignored)}")


def _decode_config(model: PreTrainedModel, gc: GenerationConfig, input_ids: torch.Tensor, given: dict,
                   seed: int | None, control: TauControl | None) -> tuple[DecodeConfig, int]:
    """DecodeConfig from the call, else the generation config's `mars` defaults; and the mask id."""
    defaults = _defaults(model, gc)
    pick = {k: given[k] if given[k] is not None else defaults.get(k) for k in given}
    mask_id = pick.pop("mask_token_id")
    if mask_id is None:
        raise ValueError("MARS needs the id of the mask token: pass mask_token_id=tokenizer.mask_token_id, "
                         "or export the model with `python -m mars_core.export`, which records it")
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError("MARS decoding needs input_ids of shape (batch, length) with length >= 1 "
                         "(inputs_embeds are not supported)")
    fields_ = {SETTINGS[k]: tuple(v) if isinstance(v, list) else v for k, v in pick.items() if v is not None}
    temperature = float(gc.temperature) if gc.do_sample else 0.0
    if gc.do_sample and seed is None:  # follow torch.manual_seed, as sampling in generate does
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
    if control is not None:
        if not isinstance(control, TauControl):
            raise ValueError(f"tau_control must be a mars TauControl, got {type(control).__name__}")
        fields_.update(tau=control.tau, metric=control.metric)
    fields_.setdefault("cache", "cursor")  # the fast path of every mode, and the one a Hub folder carries
    max_new = int(gc.max_length) - input_ids.shape[1]
    allowed = {f.name for f in fields(DecodeConfig)}
    config = DecodeConfig(**{k: v for k, v in fields_.items() if k in allowed}, temperature=temperature,
                          max_new_tokens=max_new, seed=seed if seed is not None else 0)
    return config, int(mask_id)


def _defaults(model: PreTrainedModel, gc: GenerationConfig) -> dict:
    """The generation config's `mars` entry: the decoding defaults an exported folder records."""
    defaults = getattr(gc, "mars", None) or getattr(model.generation_config, "mars", None) or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"generation_config.mars must be a dict of MARS defaults, got {type(defaults).__name__}")
    return defaults


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """The real tokens of each row; padding must be on the left."""
    ids = input_ids.tolist()
    if attention_mask is None:
        return ids
    valid = attention_mask.bool().tolist()
    prompts = []
    for i, (row, ok) in enumerate(zip(ids, valid)):
        n = sum(ok)
        if n == 0 or not all(ok[len(ok) - n:]):
            raise ValueError(f"row {i} of attention_mask is empty or not left-padded; MARS decoding needs "
                             "left padding (tokenizer.padding_side = 'left')")
        prompts.append(row[len(row) - n:])
    return prompts
