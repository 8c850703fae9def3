"""Per-browser-session state: the live controls of the running generation, the model choice and
the last generation (for the replay). One instance per session, never shared."""
from __future__ import annotations

from collections import OrderedDict
from threading import Lock

from mars_core import TauControl


class Session:
    """Kept in a `gr.State(Session())`: Gradio deep-copies the (empty) initial value once per
    browser session, so every session starts with its own object."""

    def __init__(self):
        self.mars_control: TauControl | None = None
        self.ar_control: TauControl | None = None
        self.mars_source: str | None = None  # None: the app's defaults
        self.ar_source: str | None = None
        self.quantization = "none"
        self.started = False  # the app's default pair applied (Core.page_defaults): it then stays
        self.last_accepted: list[int] = []
        self.last_block = 4
        self.duel = None  # the running duel (playground.duel.Duel), None when nothing runs
        self.last_mars = None  # the MARS side of the last generation, for the replay
        self.stop_pressed = False  # Stop since the last Generate (a queued run that fails was cancelled)
        self.run_id = 0  # Generate clicks so far: tells the current run's duel from an earlier one
        self.last_duel = None  # the last generation that ran, stopped or not
        self.train_job = None  # the Train tab's running run (playground.train_job.TrainJob)
        self.train_result = None  # its last result (training.tiny_live.Result), until the session ends
        self.train_cancel = False  # Stop while the run waited in the queue

    def stop(self) -> None:
        for ctl in (self.mars_control, self.ar_control):
            if ctl is not None:
                ctl.stop()


class SessionRegistry:
    """Sessions by Gradio session hash, so that a `gr.api` endpoint (which gets the request but
    no `gr.State`) sees the same model choice as the page's events. Bounded, least recently used
    dropped."""

    def __init__(self, capacity: int = 1000):
        self.capacity = capacity
        self._lock = Lock()
        self._items: OrderedDict[str, Session] = OrderedDict()

    def remember(self, key: str | None, session: Session) -> None:
        if not key:
            return
        with self._lock:
            self._items[key] = session
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, key: str | None) -> Session:
        """The session of `key`, or a fresh one (the app's default models)."""
        with self._lock:
            found = self._items.get(key) if key else None
        return found if found is not None else Session()
