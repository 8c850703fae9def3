"""Which models the playground runs, loaded once and shared, named without server paths.

A `ModelStore` keeps loaded models by (source, quantization); the bundled pair is pinned, other
models are evicted least-recently-used beyond `capacity`. Each browser session only records
which sources it uses, so one user's model choice never changes another's.
"""
from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from mars_core import load_model
from mars_core.loading import is_local_path as is_local
from mars_core.loading import trained_block_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED_MARS = os.path.join(ROOT, "assets", "models", "tiny-mars-b4")
BUNDLED_AR = os.path.join(ROOT, "assets", "models", "tiny-ar-sft")
RELEASED_MARS = "Xalphinions/MARS-Qwen2.5-0.5B-blk4"
RELEASED_AR = "Xalphinions/MARS-Qwen2.5-0.5B-AR-SFT"
QUANTIZATIONS = ("none", "8bit", "4bit")


def display_name(source: str | None) -> str:
    """What the UI shows for a model: a folder's basename, or the hub id."""
    if not source:
        return "(none)"
    if is_local(source):
        return os.path.basename(os.path.normpath(os.path.expanduser(source))) or "model"
    return source


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-~+@]+){2,}/?")


def scrub(message: str, sources=()) -> str:
    """A message with server paths replaced by model names (or their last component)."""
    for src in sorted((s for s in sources if s), key=len, reverse=True):
        if is_local(src):
            message = message.replace(os.path.expanduser(src), display_name(src)).replace(src, display_name(src))
    return _PATH.sub(lambda m: os.path.basename(m.group(0).rstrip("/")) or "…", message)


@dataclass
class Loaded:
    model: object
    tokenizer: object
    source: str  # private: never shown
    quantization: str
    name: str  # shown

    @property
    def context(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def trained_block_size(self) -> int | None:
        """The block size the MARS stage used, when the checkpoint records it."""
        return trained_block_size(self.source)

    def eval_json(self) -> dict | None:
        """The model card's precomputed sweep (`eval.json` in the folder), or None."""
        if not is_local(self.source):
            return None
        try:
            with open(os.path.join(self.source, "eval.json"), encoding="utf-8") as f:
                data = json.load(f)
            return data if isinstance(data, dict) and data.get("runs") else None
        except (OSError, ValueError):
            return None


class ModelStore:
    def __init__(self, capacity: int = 2, device: str | None = None, loader=load_model):
        self.capacity = capacity
        self.device = device
        self.loader = loader
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Loaded] = OrderedDict()
        self._pinned: set[tuple[str, str]] = set()

    def get(self, source: str, quantization: str = "none", pin: bool = False) -> Loaded:
        """Load (or reuse) a model; raises ValueError with a path-free message on failure."""
        if not isinstance(source, str) or not source.strip():
            raise ValueError("give a model folder or a hub id (owner/name)")
        source = source.strip()
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
        key = (source, quantization)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            try:
                model, tok = self.loader(source, device=self.device,
                                         quantization=None if quantization == "none" else quantization)
            except ValueError as e:
                raise ValueError(scrub(str(e), [source])) from None
            except Exception as e:  # noqa: BLE001 - e.g. bitsandbytes without a GPU
                raise ValueError(scrub(f"could not load {display_name(source)}: {type(e).__name__}: {e}",
                                       [source])) from None
            loaded = Loaded(model, tok, source, quantization, display_name(source))
            self._cache[key] = loaded
            if pin:
                self._pinned.add(key)
            unpinned = [k for k in self._cache if k not in self._pinned]
            while len(unpinned) > self.capacity:
                del self._cache[unpinned.pop(0)]
            return loaded

    def names(self) -> list[str]:
        with self._lock:
            return [v.name for v in self._cache.values()]
