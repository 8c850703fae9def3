"""A queue no visitor can fill for the others, through gradio_client against a launched app: one
client's 20 Frontier sweeps (or 20 model loads) never get another client's held-out /generate
refused or kept waiting; long jobs wait in their own bounded queue (playground.job_queue), bounded
per visitor too, and a cancelled job gives its place back.

The sweeps are slowed by a sleep (no CPU) so that they hold the job slot for sure; the
generation is real."""
from __future__ import annotations

import time

import pytest

import app
from app_fixtures import free_port, pair  # noqa: F401
from playground.tab_playground import _examples

HELD_OUT = _examples()[0][0]
SWEEP = (1, "1.0", 4, 8)  # problems, taus, block size, max new tokens
BAR_S = 10.0  # the bar: the other client's generation is served within this


@pytest.fixture
def slow_sweeps(monkeypatch):
    import training.evaluate

    real = training.evaluate.sweep

    def sweep(*args, **kwargs):  # the tab imports it at each run
        time.sleep(2.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(training.evaluate, "sweep", sweep)


def launch(pair, **overrides):
    demo = app.build_app(*pair, max_seconds=60, frontier_max_n=8, **overrides)
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return f"http://127.0.0.1:{port}/", demo


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def settled(jobs, timeout=60.0) -> None:
    """Wait until every job reached the server: running, waiting, or answered."""
    from gradio_client.utils import Status

    end = time.monotonic() + timeout
    while any(j.status().code in (Status.STARTING, Status.JOINING_QUEUE) for j in jobs):
        assert time.monotonic() < end, [j.status().code for j in jobs]
        time.sleep(0.1)
    time.sleep(0.5)  # a refusal is answered within this


def refusals(jobs) -> list[str]:
    out = []
    for j in jobs:
        if j.done():
            try:
                j.result(timeout=0)
            except Exception as e:  # noqa: BLE001 - the refusal's message is what we check
                out.append(str(e))
    return out


def timed_generate(url) -> float:
    t0 = time.perf_counter()
    out = client(url).predict(prompt=HELD_OUT, api_name="/generate")
    took = time.perf_counter() - t0
    assert out["mars"]["stats"]["tokens"] > 0
    return took


def stop_all(jobs, demo) -> None:
    for j in jobs:
        try:
            j.cancel()
        except Exception:  # noqa: BLE001 - clean-up only: a slow answer must not hide the test's own result
            pass
    demo.close()


def test_twenty_sweeps_of_one_visitor_leave_a_generation_free(pair, slow_sweeps):
    url, demo = launch(pair)
    mine, sweeps = client(url), []
    try:
        sweeps = [mine.submit(*SWEEP, api_name="/frontier") for _ in range(20)]
        settled(sweeps)
        took = timed_generate(url)
        print(f"/generate of a held-out example with 20 sweeps submitted: {took:.2f} s")
        assert took < BAR_S
        refused = refusals(sweeps)
        assert len(refused) == 18, refused  # one runs, one waits: the bound per visitor
        assert all("you already have 2 long jobs queued or running" in r for r in refused), refused[:1]
        assert demo.core.jobs.counts() == (1, 1)
    finally:
        stop_all(sweeps, demo)


def test_twenty_queued_sweeps_are_bounded_by_their_own_queue(pair, slow_sweeps):
    """Bounds raised so that all 20 really wait: Gradio's own queue (max_queue=16) is not what
    holds them, so a generation still runs at once; a third visitor's sweep is refused by the
    long-job queue's own bound; cancelled jobs give their places back."""
    url, demo = launch(pair, jobs_per_session=20, job_queue=19)
    mine, sweeps = client(url), []
    try:
        sweeps = [mine.submit(*SWEEP, api_name="/frontier") for _ in range(20)]
        settled(sweeps)
        assert demo.core.jobs.counts() == (1, 19) and refusals(sweeps) == []
        assert timed_generate(url) < BAR_S
        with pytest.raises(Exception, match="long job queue is full"):
            client(url).predict(*SWEEP, api_name="/frontier")
        for j in sweeps:
            j.cancel()
        end = time.monotonic() + 30
        while demo.core.jobs.counts() != (0, 0):  # each waiting job leaves within its poll
            assert time.monotonic() < end, demo.core.jobs.counts()
            time.sleep(0.2)
    finally:
        stop_all(sweeps, demo)


def test_twenty_model_loads_of_one_visitor_leave_a_generation_free(pair, monkeypatch):
    """Loading a model can take a minute (a hub download): loads queue apart from generations too."""
    url, demo = launch(pair)
    real = demo.core.store.get

    def slow_get(*args, **kwargs):
        time.sleep(2.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(demo.core.store, "get", slow_get)
    mine, loads = client(url), []
    try:
        loads = [mine.submit("bundled", "", "", "none", api_name="/load_models") for _ in range(20)]
        settled(loads)
        assert timed_generate(url) < BAR_S
        refused = refusals(loads)
        assert len(refused) == 19 and "you already have 1 model load queued or running" in refused[0], refused[:1]
    finally:
        stop_all(loads, demo)
