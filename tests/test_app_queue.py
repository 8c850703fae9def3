"""A queue no visitor can fill for the others, through gradio_client against a launched app: one
client's 20 Frontier sweeps (or 20 model loads) never get another client's held-out /generate
refused or kept waiting; long jobs wait in their own bounded queue (playground.job_queue), bounded
per visitor too, and a cancelled job gives its place back.

The sweeps (and loads) are held on an event (no CPU) until the test has looked, so that they hold
their slots for sure however slow the machine (a 2 s sleep did not on a loaded 2-core CPU: the
generation took 4 s and the first sweep had finished); the generation is real and must come back
while every long job is still held. No timed bar: HANG_S only keeps a broken queue from hanging."""
from __future__ import annotations

import threading
import time

import pytest

import app
from app_fixtures import HANG_S, free_port, held, pair  # noqa: F401
from playground.tab_playground import _examples

HELD_OUT = _examples()[0][0]
SWEEP = (1, "1.0", 4, 8)  # problems, taus, block size, max new tokens


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def held_sweeps(monkeypatch, release):
    import training.evaluate

    monkeypatch.setattr(training.evaluate, "sweep", held(training.evaluate.sweep, release))  # the tab imports it at each run


def launch(pair, **overrides):
    demo = app.build_app(*pair, max_seconds=60, frontier_max_n=8, **overrides)
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return f"http://127.0.0.1:{port}/", demo


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def submit_each(client, n: int, *args, api_name: str, timeout: float = 60.0) -> list:
    """n jobs of one visitor, each sent once the one before has left Gradio's queue. A burst of 20
    at once can meet Gradio's own max_size (16, every concurrency id together) in the moment before
    its loop moves long jobs out: on a loaded 2-core CPU 3 of 20 were refused "Queue is full" in 2
    of 5 runs. That transient is Gradio's, said in playground.job_queue; these tests are about ours."""
    from gradio_client.utils import Status

    jobs, end = [], time.monotonic() + timeout
    for _ in range(n):
        job = client.submit(*args, api_name=api_name)
        while job.status().code in (Status.STARTING, Status.JOINING_QUEUE, Status.IN_QUEUE):
            assert time.monotonic() < end, job.status().code
            time.sleep(0.05)
        jobs.append(job)
    return jobs


def settled(jobs, timeout=60.0) -> None:
    """Wait until every job reached the server: running, waiting, or answered."""
    from gradio_client.utils import Status

    end = time.monotonic() + timeout
    while any(j.status().code in (Status.STARTING, Status.JOINING_QUEUE) for j in jobs):
        assert time.monotonic() < end, [j.status().code for j in jobs]
        time.sleep(0.1)
    time.sleep(0.5)  # a refusal is answered within this


def refusals(jobs, n: int = 0, timeout: float = 30.0) -> list[str]:
    """The refusals' messages, once at least n jobs are answered (a loaded machine answers late)."""
    end = time.monotonic() + timeout
    while sum(j.done() for j in jobs) < n and time.monotonic() < end:
        time.sleep(0.1)
    out = []
    for j in jobs:
        if j.done():
            try:
                j.result(timeout=0)
            except Exception as e:  # noqa: BLE001 - the refusal's message is what we check
                out.append(str(e))
    return out


def generate_while_held(url, demo) -> float:
    """Another visitor's /generate answered while the long jobs in the queue stay exactly where they
    were (none can finish: they are held), so it did not wait behind them."""
    before = demo.core.jobs.counts()
    t0 = time.perf_counter()
    out = client(url).submit(prompt=HELD_OUT, api_name="/generate").result(timeout=HANG_S)
    took = time.perf_counter() - t0
    assert out["mars"]["stats"]["tokens"] > 0
    assert demo.core.jobs.counts() == before
    print(f"/generate of a held-out example beside the held jobs: {took:.2f} s")
    return took


def counts_reach(demo, counts, timeout=30.0) -> None:
    end = time.monotonic() + timeout
    while demo.core.jobs.counts() != counts:
        assert time.monotonic() < end, (demo.core.jobs.counts(), counts)
        time.sleep(0.2)


def stop_all(jobs, demo, release: threading.Event) -> None:
    release.set()
    for j in jobs:
        try:
            j.cancel()
        except Exception:  # noqa: BLE001 - clean-up only: a slow answer must not hide the test's own result
            pass
    demo.close()


def test_twenty_sweeps_of_one_visitor_leave_a_generation_free(pair, held_sweeps, release):
    url, demo = launch(pair)
    mine, sweeps = client(url), []
    try:
        sweeps = submit_each(mine, 20, *SWEEP, api_name="/frontier")
        settled(sweeps)
        counts_reach(demo, (1, 1))  # one runs, one waits: the bound per visitor
        generate_while_held(url, demo)
        refused = refusals(sweeps, 18)
        assert len(refused) == 18, refused
        assert all("you already have 2 long jobs queued or running" in r for r in refused), refused[:1]
    finally:
        stop_all(sweeps, demo, release)


def test_twenty_queued_sweeps_are_bounded_by_their_own_queue(pair, held_sweeps, release):
    """Bounds raised so that all 20 really wait: Gradio's own queue (max_queue=16) is not what
    holds them, so a generation still runs at once; a third visitor's sweep is refused by the
    long-job queue's own bound; cancelled jobs give their places back."""
    url, demo = launch(pair, jobs_per_session=20, job_queue=19)
    mine, sweeps = client(url), []
    try:
        sweeps = submit_each(mine, 20, *SWEEP, api_name="/frontier")
        settled(sweeps)
        counts_reach(demo, (1, 19))
        assert refusals(sweeps) == []
        generate_while_held(url, demo)
        with pytest.raises(Exception, match="long job queue is full"):
            client(url).predict(*SWEEP, api_name="/frontier")
        # Gradio's /cancel cancels every task of the visitor's endpoint and awaits them all, the held
        # one too, so the held sweep ends first; then each waiting job leaves within its poll
        release.set()
        for j in sweeps:
            j.cancel()
        counts_reach(demo, (0, 0), timeout=60.0)
    finally:
        stop_all(sweeps, demo, release)


def test_twenty_model_loads_of_one_visitor_leave_a_generation_free(pair, monkeypatch, release):
    """Loading a model can take a minute (a hub download): loads queue apart from generations too."""
    url, demo = launch(pair)
    monkeypatch.setattr(demo.core.store, "get", held(demo.core.store.get, release))
    mine, loads = client(url), []
    try:
        loads = submit_each(mine, 20, "bundled", "", "", "none", api_name="/load_models")
        settled(loads)
        generate_while_held(url, demo)
        refused = refusals(loads, 19)
        assert len(refused) == 19 and "you already have 1 model load queued or running" in refused[0], refused[:1]
    finally:
        stop_all(loads, demo, release)
