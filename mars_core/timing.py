"""What a forward of a model costs on this machine: timed forwards, and a disk cache keyed on what
the timing depends on. Read by `fastest` (the cost curve) and `kernel_choice` (prepack="auto")."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CURVE_FORMAT = 3  # 3: a gated one-token forward skips the adapters, windows hold masks, rounds rotate; a new format re-measures


def machine_key(model: PreTrainedModel, batch: int) -> str:
    """What a cost curve depends on: the model's shapes and dtype, the device, the CPU, torch, threads."""
    p = next(model.parameters())
    cfg = model.config
    parts = [cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, getattr(cfg, "intermediate_size", 0),
             cfg.vocab_size, str(p.dtype), str(p.device), torch.__version__, torch.get_num_threads(), batch,
             platform.machine(), _cpu_name(), _kernel_kind(model.model.layers[0].self_attn.q_proj), _gate_shape(model),
             CURVE_FORMAT]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _kernel_kind(layer) -> str:
    """What runs a linear layer: its class, and for a mask-gated one the base's class and whether
    its adapters are stacked with their siblings (each changes what a forward costs)."""
    base = getattr(layer, "base", None)
    if base is None:
        return type(layer).__name__
    return f"{type(layer).__name__}({type(base).__name__}, stacked={getattr(layer, 'siblings', None) is not None})"


def _gate_shape(model) -> list | None:
    """A mask gate's rank and wrapped weights (a gate on five matrices or on fewer layers runs fewer
    adapters a forward than one on all), None without a gate."""
    from .gate import wrapped_layers

    layers = wrapped_layers(model)
    if not layers:
        return None
    return [next(iter(layers.values())).lora_a.shape[0], sorted(layers)]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    return hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    return platform.processor()


def _store(kind: str) -> Path:
    from .packaged import cache_root

    return cache_root() / "exact" / kind


def cached(kind: str, key: str, make):
    """`make()`'s JSON value, kept under the cache root by kind and key (made once, written atomically)."""
    path = _store(kind) / f"{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
    return value


def timed_widths(model: PreTrainedModel, batch: int, context: int, repeats: int,
                  widths: tuple[int, ...]) -> dict[int, float]:
    """{W: median seconds of a forward of W new tokens: a root and drafts, then masks}."""
    from transformers import DynamicCache

    from .gate import gate_of

    gate = gate_of(model)
    mask_id = gate.mask_id if gate is not None else None
    dev = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (batch, context + max(widths)), device=dev)
    if mask_id is not None:
        ids[ids == mask_id] = 0  # real tokens only; the masks go where a step puts them
    past = DynamicCache()
    model(input_ids=ids[:, :context], cache=past, use_cache=True)

    def once(w: int) -> float:
        x = ids[:, context:context + w].clone()
        if mask_id is not None:
            x[:, 1 + (w - 1) // 2:] = mask_id  # (batch, w): the root and drafts, then masks (none at w = 1)
        start = time.perf_counter()
        model(input_ids=x, cache=past, use_cache=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        past.crop(-w)  # back to the context (transformers 5: a negative count removes)
        return time.perf_counter() - start

    runs: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(repeats + 1):  # the first round is a warm-up
        for w in widths[r % len(widths):] + widths[:r % len(widths)]:
            t = once(w)
            if r:
                runs[w].append(t)
    return {w: sorted(ts)[len(ts) // 2] for w, ts in runs.items()}
