"""The frozen layers' output of each example, computed once and kept in memory and in a folder.

Runs may share a folder (`frozen_stage --lower`), so an entry is only as good as its key: the
hidden states depend on the example's tokens and response start, the block size and mask id
(the noisy half's layout), the number of frozen layers, and the frozen weights and config. The
folder's `key.json` holds what is common to every entry; a run whose setting differs is refused
with what differs (recomputing would overwrite the other run's entries under its feet), and an
entry is named after and stamped with its own tokens, so another data file or an edited record
never reads a stale one.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch

from training.frozen_layers import compact_inputs, lower_hidden

KEY_FILE = "key.json"
FORMAT = 2  # 1: bare tensors named by record id, with no key (trusted blindly: the defect this fixes)
SHOWN = {"split": "--train-layers", "block_size": "--block-size", "mask_id": "the tokenizer's mask id",
         "model": "--base (the frozen layers' weights and config)", "format": "the cache format"}


def model_digest(model, split: int) -> str:
    """sha256 of what the first `split` layers compute with: the config (rotary, norms, heads) and
    the weights of the embeddings and of those layers, bit for bit."""
    h = hashlib.sha256()
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    inner = model.model
    parts = [("embed_tokens", inner.embed_tokens)] + [(f"layers.{i}", inner.layers[i]) for i in range(split)]
    for prefix, module in parts:
        for name, t in sorted(module.state_dict().items()):
            t = t.detach().cpu().contiguous()
            h.update(f"{prefix}.{name} {t.dtype} {tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the bytes in place: no copy of the weights
    return h.hexdigest()


def _entry_name(rid: int, ids: list[int], start: int) -> str:
    digest = hashlib.sha256(json.dumps([ids, start]).encode()).hexdigest()[:16]
    return f"{rid}-{digest}.pt"


class LowerCache:
    """The frozen layers' output per example, computed on first use, kept in memory and on disk."""

    def __init__(self, model, split: int, block_size: int, mask_id: int, folder: str):
        self.model, self.split, self.block_size, self.mask_id = model, split, block_size, mask_id
        self.folder, self.memory = folder, {}
        self.key = {"format": FORMAT, "split": split, "block_size": block_size, "mask_id": mask_id,
                    "model": model_digest(model, split)}
        os.makedirs(folder, exist_ok=True)
        self._claim()

    def _claim(self) -> None:
        """Write the folder's key, or check the one there: another setting is refused."""
        path = os.path.join(self.folder, KEY_FILE)
        if not os.path.isfile(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.key, f, indent=1)
            try:
                os.link(tmp, path)  # fails if another run claimed the folder meanwhile: checked below
            except FileExistsError:
                pass
            finally:
                os.remove(tmp)
        with open(path, encoding="utf-8") as f:
            there = json.load(f)
        diff = [k for k in self.key if there.get(k) != self.key[k]]
        if diff:
            shown = "; ".join(f"{k} {there.get(k)!r} (this run {self.key[k]!r}: {SHOWN[k]})" for k in diff)
            raise ValueError(f"the frozen-layer cache {self.folder} holds the outputs of another setting: {shown}; "
                             "give this run another --lower folder (or remove that one)")

    def get(self, example):
        """(compact layout, frozen layers' output) of one (record id, ids, response start) example."""
        rid, ids, start = example
        c = compact_inputs(ids, start, self.block_size, self.mask_id)
        name = _entry_name(rid, ids, start)
        if name not in self.memory:
            path = os.path.join(self.folder, name)
            entry = torch.load(path) if os.path.isfile(path) else None
            if not self._fits(entry, ids, start):
                entry = {"key": self.key, "ids": list(ids), "start": start,
                         "hidden": lower_hidden(self.model, c, self.split)}
                torch.save(entry, path + ".tmp")
                os.replace(path + ".tmp", path)
            self.memory[name] = entry["hidden"]
        return c, self.memory[name]

    def _fits(self, entry, ids: list[int], start: int) -> bool:
        # the name holds 64 bits of the tokens' hash and the folder a key that can be removed: the
        # entry itself is checked in full
        return (isinstance(entry, dict) and entry.get("key") == self.key and entry.get("ids") == list(ids)
                and entry.get("start") == start)
