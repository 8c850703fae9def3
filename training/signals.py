"""Stopping cleanly on Ctrl-C or SIGTERM: finish the optimizer step, checkpoint, exit."""
from __future__ import annotations

import signal
import threading

class StopSignal:
    """While active, SIGINT/SIGTERM only set `requested`; the loop checkpoints and stops at the next
    optimizer step. A second Ctrl-C raises KeyboardInterrupt at once. Off-main-thread: no-op."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
