"""The long-job queue (playground.job_queue) on its own, threads only: slots, the bound on the
line, the bound per visitor, a kind with its own cap (training: one run at a time), arrival order,
and a slot handed on however a job ends."""
from __future__ import annotations

import threading

import pytest

from playground.job_queue import JobQueue, QueueFull


def test_one_runs_the_next_waits_and_starts_when_the_first_ends():
    q = JobQueue(slots=1, max_waiting=4, per_owner=2)
    first, second = q.enter("a"), q.enter("b")
    assert first.running and not second.running
    assert (first.ahead, second.ahead) == (0, 1) and q.counts() == (1, 1)
    assert second.wait(0.05) is False  # timed out: still waiting
    first.release()
    assert second.wait(0) is True and second.running and q.counts() == (1, 0)
    second.release()
    assert q.counts() == (0, 0)


def test_a_full_line_refuses_at_once_with_a_message_for_the_visitor():
    q = JobQueue(slots=1, max_waiting=2, per_owner=1)
    tickets = [q.enter(owner) for owner in "abc"]  # one runs, two wait
    with pytest.raises(QueueFull, match=r"long job queue is full \(2 waiting, 1 running\)") as e:
        q.enter("d")
    assert isinstance(e.value, ValueError) and "try again" in str(e.value)
    assert q.counts() == (1, 2)  # the refused job left no trace
    tickets[0].release()
    q.enter("d").release()  # room again


def test_one_visitor_cannot_fill_the_line_for_the_others():
    q = JobQueue(slots=1, max_waiting=8, per_owner=2)
    mine = [q.enter("me"), q.enter("me")]
    for _ in range(18):  # the rest of a visitor's 20 sweeps
        with pytest.raises(QueueFull, match="you already have 2 long jobs queued or running"):
            q.enter("me")
    other = q.enter("you")  # another visitor still gets a place
    assert other.ahead == 2 and q.counts() == (1, 2)
    mine[0].release()
    q.enter("me").release()  # one of mine ended: I may queue again
    for t in (mine[1], other):
        t.release()


def test_owners_are_told_apart_by_identity_not_equality():
    class Session:  # two fresh sessions compare equal by value but are two visitors
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    q = JobQueue(slots=1, max_waiting=4, per_owner=1)
    a, b = Session(), Session()
    q.enter(a)
    q.enter(b)  # not refused as "you already have one"


def test_a_kind_with_its_own_cap_runs_one_at_a_time_and_lets_others_pass():
    q = JobQueue(slots=3, max_waiting=8, per_owner=5, kind_slots={"train": 1})
    train1 = q.enter("a", "train")
    train2 = q.enter("b", "train")
    sweep = q.enter("c", "sweep")
    assert train1.running and not train2.running and sweep.running  # a free slot is not left idle
    train1.release()
    assert train2.running and q.counts() == (2, 0)


def test_arrival_order_and_release_of_a_waiting_job():
    q = JobQueue(slots=1, max_waiting=4, per_owner=4)
    run, w1, w2, w3 = (q.enter(o) for o in "abcd")
    assert [t.ahead for t in (w1, w2, w3)] == [1, 2, 3]
    w2.release()  # a visitor left while waiting: its place goes, nothing runs twice
    w2.release()  # releasing twice is harmless
    assert w3.ahead == 2 and q.counts() == (1, 2)
    run.release()
    assert w1.running and not w3.running


def test_the_with_block_releases_on_error_and_a_waiter_in_another_thread_starts():
    q = JobQueue(slots=1, max_waiting=2, per_owner=2)
    started = threading.Event()
    holder = q.enter("a")

    def second_job():
        with q.enter("b") as t:
            if t.wait(10):
                started.set()

    thread = threading.Thread(target=second_job)
    thread.start()
    with pytest.raises(RuntimeError):
        with holder:
            raise RuntimeError("the job failed")
    assert started.wait(10)  # the failed job's slot went to the waiting one
    thread.join(10)
    assert q.counts() == (0, 0)


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="slots >= 1"):
        JobQueue(slots=0)
