"""Visitors' trained models: in the server's memory only, one per session, a bounded number in all.

A model trained on the Train tab becomes its session's MARS side (the AR side: the bundled AR
checkpoint it was trained from). It is never written to disk; it is dropped when its session ends
(Gradio deletes the session's state, and with it the last reference), when the session trains
another, or, once the server holds `capacity` of them, when it has not been used for `idle_s`
seconds and another visitor needs the room. With all of them in use, a new one is refused with a
message that says so.
"""
from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

from .models import Loaded

TRAINED = "trained"  # Session.mars_source of a session whose MARS side is its trained model (never a path)


@dataclass
class TrainedLoaded(Loaded):
    """A trained model as the playground's other models are described: its block size, no folder,
    and its own evaluations as its "card" (what the Playground's line on each mode reads)."""

    block_size: int = 4
    evals: list | None = None
    objective: str = "paper"
    data: str = "synthetic"  # what it was trained on (playground.scope reads it)

    @property
    def trained_block_size(self) -> int:
        return self.block_size

    def folder(self) -> None:
        return None

    def eval_json(self) -> dict | None:
        last = (self.evals or [None])[-1]
        if last is None:
            return None
        run = lambda tau, key: {"model": self.name, "mode": "mars", "tau": tau, "block_size": self.block_size,  # noqa: E731
                                "tokens_per_forward": last[f"tpf_{key}"], "accuracy": last[f"acc_{key}"],
                                "tokens_per_second": None}
        return {"n": last["n"], "runs": [run(1.0, "1"), run(0.95, "095")], "source": "the run's last evaluation"}


class TrainedModels:
    def __init__(self, capacity: int = 8, idle_s: float = 1800.0):
        self.capacity, self.idle_s = capacity, idle_s
        self._lock = threading.Lock()
        # keyed by the session object itself, weakly: a session Gradio forgets takes its model with it
        self._items: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def put(self, session, loaded: Loaded) -> None:
        """Hold `loaded` as `session`'s model (replacing its earlier one), or a ValueError at the limit."""
        with self._lock:
            self._items.pop(session, None)
            if len(self._items) >= self.capacity:
                now = time.monotonic()
                idle = sorted((used, id(s), s) for s, (_, used) in self._items.items() if now - used > self.idle_s)
                if not idle:
                    raise ValueError(f"The server already holds {self.capacity} visitors' trained models, its limit, "
                                     f"all used in the last {self.idle_s / 60:.0f} minutes: yours was not loaded. Try "
                                     "again in a few minutes (the training result stays on this page).")
                del self._items[idle[0][2]]
            self._items[session] = (loaded, time.monotonic())

    def get(self, session) -> Loaded | None:
        with self._lock:
            got = self._items.get(session)
            if got is None:
                return None
            self._items[session] = (got[0], time.monotonic())
            return got[0]

    def drop(self, session) -> None:
        with self._lock:
            self._items.pop(session, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
