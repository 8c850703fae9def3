"""A bounded queue for long jobs (Frontier sweeps, Batch and Under load runs, model loads, later
training), kept apart from Gradio's queue.

Why not Gradio's queue: its `max_size` counts the waiting events of every concurrency id together,
so one visitor's 20 queued sweeps made it refuse another visitor's generation while both decode
slots sat idle. A long job therefore leaves Gradio's queue at once (its event has no concurrency
limit there) and waits here instead, where the bounds are its own. "At once" is Gradio's loop's next
turn: a burst of 20 submissions on a loaded 2-core CPU met Gradio's "Queue is full" for 3 of them
in 2 runs of 5 (tests/test_app_queue.py sends its jobs one by one for that reason). And Gradio's
/cancel cancels every task of a visitor's endpoint and awaits them all, so a waiting job cancelled
beside a running one gives its place back when the running one ends.

- `slots` jobs run at once, for all visitors; `kind_slots` caps a kind further (training: one run
  at a time server-wide, however many slots the other jobs have);
- at most `max_waiting` jobs wait, for all visitors;
- at most `per_owner` jobs of one owner (a visitor's session) are queued or running.

A job over a bound is refused at once with `QueueFull`, a ValueError whose message the visitor
reads. Use:

    with queue.enter(session, kind="sweep") as ticket:   # raises QueueFull
        while not ticket.wait(1.0):
            show(ticket.ahead)                            # jobs in front of this one
        run()                                             # the slot is held until the with ends

Threads only, no Gradio: the page's side of it is `playground.runs.gated`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Hashable


class QueueFull(ValueError):
    """A job the queue refused: its message says why, in words for the visitor."""


class Ticket:
    """One job's place: waiting, then running (`running`), then released. Release it exactly
    once, by leaving the `with` block (or `release()`), whether the job ran or not."""

    def __init__(self, queue: JobQueue, owner: Hashable, kind: str):
        self.queue, self.owner, self.kind = queue, owner, kind
        self.running = False
        self.released = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job may run (True) or `timeout` seconds passed (False)."""
        return self.queue._wait(self, timeout)

    @property
    def ahead(self) -> int:
        """Jobs that will start before this one (those running included); 0 once it runs."""
        return self.queue._ahead(self)

    def release(self) -> None:
        self.queue._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class JobQueue:
    def __init__(self, slots: int = 1, max_waiting: int = 8, per_owner: int = 2,
                 kind_slots: dict[str, int] | None = None, what: str = "long job"):
        if slots < 1 or max_waiting < 0 or per_owner < 1:
            raise ValueError(f"a job queue needs slots >= 1, max_waiting >= 0 and per_owner >= 1, got "
                             f"{slots}, {max_waiting}, {per_owner}")
        self.slots, self.max_waiting, self.per_owner = slots, max_waiting, per_owner
        self.kind_slots = dict(kind_slots or {})
        self.what = what
        self._cond = threading.Condition()
        self._running: list[Ticket] = []
        self._waiting: list[Ticket] = []  # in arrival order

    def enter(self, owner: Hashable, kind: str = "job") -> Ticket:
        """A ticket for one job of `owner`; running at once if a slot is free, else waiting.
        Raises QueueFull when the owner already has `per_owner` jobs here, or the line is full."""
        with self._cond:
            mine = sum(t.owner is owner for t in self._running + self._waiting)
            if mine >= self.per_owner:
                raise QueueFull(self._owner_message(mine))
            ticket = Ticket(self, owner, kind)
            self._waiting.append(ticket)
            self._promote()
            if not ticket.running and len(self._waiting) > self.max_waiting:
                self._waiting.remove(ticket)
                raise QueueFull(f"Not run: the {self.what} queue is full ({self.max_waiting} waiting, "
                                f"{len(self._running)} running). Nothing was lost; try again in a minute.")
            return ticket

    def counts(self) -> tuple[int, int]:
        """(running, waiting) now."""
        with self._cond:
            return len(self._running), len(self._waiting)

    def _owner_message(self, mine: int) -> str:
        jobs = f"{mine} {self.what}{'s' if mine != 1 else ''}"
        return (f"Not run: you already have {jobs} queued or running, and each visitor may have at most "
                f"{self.per_owner} at a time. Nothing was lost; run it again once one of yours has finished.")

    def _can_start(self, ticket: Ticket, running: list[Ticket]) -> bool:
        cap = self.kind_slots.get(ticket.kind)
        return len(running) < self.slots and (cap is None or sum(t.kind == ticket.kind for t in running) < cap)

    def _promote(self) -> None:
        """Start waiting jobs in arrival order while slots allow; a job whose kind is at its cap
        lets the ones behind it pass rather than leave a slot idle. Holds the lock."""
        for ticket in list(self._waiting):
            if self._can_start(ticket, self._running):
                self._waiting.remove(ticket)
                self._running.append(ticket)
                ticket.running = True
        self._cond.notify_all()

    def _wait(self, ticket: Ticket, timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not ticket.running and not ticket.released:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return ticket.running

    def _ahead(self, ticket: Ticket) -> int:
        with self._cond:
            if ticket.running or ticket not in self._waiting:
                return 0
            return len(self._running) + self._waiting.index(ticket)

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket.released:
                return
            ticket.released = True
            if ticket in self._running:
                self._running.remove(ticket)
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            ticket.running = False
            self._promote()
