"""The named API through gradio_client against a launched app: results, the session's model
choice, and field-named messages for out-of-range values (every decoding endpoint, /under_load
included) with no traceback in the server log."""
from __future__ import annotations

import threading
import time

import pytest

import app
from app_fixtures import HANG_S, PROMPT, demo, free_port, held, pair  # noqa: F401
from mars_core import mars_training_mask
from playground.duel import AR_SIDES


@pytest.fixture(scope="module")
def server(demo):
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture
def client(server):
    from gradio_client import Client

    return Client(server, verbose=False)


def test_client_generate(client):
    out = client.predict(PROMPT, 0.0, 4, "probability", 0.0, 0, 16, "sliding", AR_SIDES[0], api_name="/generate")
    assert out["mars"]["accepted_per_step"] == [4, 4, 4, 4]
    assert out["ar"]["stats"]["tokens"] == 16 and out["mars"]["stats"]["tokens_per_forward"] == 4.0
    out = client.predict(prompt=PROMPT, tau=1.0, ar_side=AR_SIDES[1], max_new_tokens=12, api_name="/generate")
    assert out["agree"] is True and out["first_difference"] is None
    assert client.predict(4, 2, api_name="/mask") == mars_training_mask(4, 2).int().tolist()


def test_generate_follows_the_sessions_model_choice(client, server):
    from gradio_client import Client

    client.predict("custom", "fixture-ar", "", "none", api_name="/load_models")
    out = client.predict(prompt=PROMPT, max_new_tokens=4, api_name="/generate")
    assert out["mars"]["model"] == "fixture-ar"
    other = Client(server, verbose=False).predict(prompt=PROMPT, max_new_tokens=4, api_name="/generate")
    assert other["mars"]["model"] == "fixture-mars"  # another client keeps the defaults


def test_generate_stream_returns_named_outputs(client):
    out = client.predict(PROMPT, 0.0, 4, "probability", 0.0, 0, 8, "sliding", AR_SIDES[0], 0,
                         api_name="/generate_stream")
    assert len(out) == 8 and 'data-status="limit"' in out[2] and "Forward 1 of 2" in out[7]


GENERATE = dict(prompt=PROMPT, tau=0.9, block_size=4, metric="probability", temperature=0.0, seed=0,
                max_new_tokens=16, cache="sliding", ar_side=AR_SIDES[0])
STREAM = [PROMPT, 0.9, 4, "probability", 0.0, 0, 16, "sliding", AR_SIDES[0], 0]
LOAD = ["steady", 0.5, 3, "adaptive", False, 1.0, 1]  # pattern, rate, duration, policy, compare, target, slots
LOAD_LONG = ["steady", 10.0, 3, "adaptive", False, 1.0, 2]  # 30 requests: seconds on the test model


@pytest.mark.parametrize("api,args,message", [
    ("/generate", dict(GENERATE, prompt=""), "prompt is empty"),
    ("/generate", dict(GENERATE, max_new_tokens=100_000), "max new tokens must be between 1 and 256"),
    ("/generate", dict(GENERATE, tau=-0.5), "tau for the probability metric must be in [0, 1]"),
    ("/generate", dict(GENERATE, block_size=999), "block size must be between 1 and 16"),
    ("/generate", dict(GENERATE, metric="nope"), "unknown metric"),
    ("/generate_stream", STREAM[:2] + [999] + STREAM[3:], "block size must be between 1 and 16"),
    ("/generate_stream", STREAM[:6] + [100_000] + STREAM[7:], "max new tokens must be between 1 and 256"),
    ("/generate_stream", STREAM[:3] + ["<b>nope</b>"] + STREAM[4:], "unknown metric '<b>nope</b>'"),
    ("/generate_stream", STREAM[:9] + [99_999], "slow motion (ms per forward) must be between 0 and 500"),
    ("/batch", [999, "cursor", 16, 0.9, 4, 16, 1], "batch size must be between 1 and 4"),
    ("/batch", [2, "cursor", 16, 7.0, 4, 16, 1], "tau must be between 0 and 1"),
    ("/batch", [2, "cursor", 16, 0.9, 4, 16, 99], "repeats must be between 1 and 7"),
    ("/frontier", [999, "1.0", 4, 16], "problems must be between 1 and 8"),
    ("/frontier", [2, "1.0", 4, 99_999], "max new tokens must be between 1 and 256"),
    ("/frontier", [2, "<img src=x>", 4, 16], "taus: tau must be a number, got '<img src=x>'"),
    ("/under_load", LOAD[:1] + [99.0] + LOAD[2:], "rate must be between 0.5 and 20, got 99.0"),
    ("/under_load", LOAD[:1] + [0.0] + LOAD[2:], "rate must be between 0.5 and 20, got 0.0"),
    ("/under_load", ["<b>spiky</b>"] + LOAD[1:], "pattern must be one of bursty, steady, got '<b>spiky</b>'"),
    ("/under_load", LOAD[:2] + [999] + LOAD[3:], "duration must be between 3 and 30, got 999"),
    ("/under_load", LOAD[:2] + [2] + LOAD[3:], "duration must be between 3 and 30, got 2"),
    ("/batch", [2, "block", 128, 0.9, 4, 16, 1], "cache block size must be between 4 and 64, got 128"),
    ("/batch", [2, "cursor", 16, 0.9, 4, 2, 1], "max new tokens must be between 8 and"),
    ("/mask", [1, 4], "n must be between 2 and 32, got 1"),
    ("/mask", [8, 17], "block_size must be between 1 and 16, got 17"),
    ("/generate", dict(GENERATE, prompt=123), "The prompt must be text"),
    ("/under_load", LOAD[:3] + ["fixed 0.1"] + LOAD[4:], "policy must be one of adaptive, fixed 1.0, fixed 0.95"),
    ("/under_load", LOAD[:5] + [0.0] + LOAD[6:], "latency target must be between 0.05 and 60, got 0.0"),
    ("/under_load", LOAD[:6] + [99], "slots must be between 1 and 8, got 99"),
    ("/load_models", ["custom", "/etc", "", "none"], "unknown model '/etc'"),
    ("/generate", dict(GENERATE, mars_mode="tree", block_size=1), "set temperature to 0 and block size B >= 2"),
    ("/generate", dict(GENERATE, metric="<b>nope</b>"), "unknown metric '<b>nope</b>'"),
    ("/load_models", ["custom", "<img src=x>", "", "none"], "unknown model '<img src=x>'"),
])
def test_out_of_range_values_get_field_named_messages(client, capfd, api, args, message):
    with pytest.raises(Exception) as e:
        if isinstance(args, dict):
            client.predict(api_name=api, **args)
        else:
            client.predict(*args, api_name=api)
    assert message in str(e.value) and "Traceback" not in str(e.value)
    assert "&lt;" not in str(e.value) and "&gt;" not in str(e.value)  # plain text: the page's escaping stays there
    assert "Traceback" not in capfd.readouterr().err  # nothing for the server log either


@pytest.mark.parametrize("api,data,wanted", [("generate", ["hi"], 10), ("generate_stream", [], 11), ("batch", [2], 7),
                                              ("load_models", [], 4)])
def test_too_few_values_get_a_plain_message(server, api, data, wanted):
    """A raw HTTP call (no gradio_client to fill in defaults) with values missing."""
    import httpx

    event = httpx.post(f"{server}gradio_api/call/{api}", json={"data": data}, timeout=30).json()["event_id"]
    answer = httpx.get(f"{server}gradio_api/call/{api}/{event}", timeout=60).text
    assert f"/{api} takes {wanted} values, got {len(data)}" in answer, answer
    assert "0x" not in answer and "null" not in answer


def test_uploads_are_refused(server):
    """The app takes no files: an anonymous 1 MB upload must not land on the server's disk."""
    import httpx

    r = httpx.post(server + "gradio_api/upload", files={"files": ("big.bin", b"x" * (1 << 20))}, timeout=30)
    assert r.status_code >= 400, r.status_code
    r = httpx.post(server + "gradio_api/upload", files={"files": ("small.txt", b"x" * 1024)}, timeout=30)
    assert r.status_code >= 400, r.status_code


def test_long_jobs_cannot_take_the_generation_slots(server, demo, monkeypatch):  # noqa: F811
    """Two long jobs from two clients: one runs, the other waits in the jobs' own queue, and a
    third client's generation runs at once (it needs neither job to finish). The load runs are
    held until the generation is back (a timed sleep raced them on a loaded CPU), so "neither job
    moved" holds however slow the machine; HANG_S only guards against a hang."""
    import benchmarks.load
    from gradio_client import Client

    release = threading.Event()
    monkeypatch.setattr(benchmarks.load, "run_load", held(benchmarks.load.run_load, release))  # imported at each run
    jobs = [Client(server, verbose=False).submit(*LOAD_LONG, api_name="/under_load") for _ in range(2)]
    try:
        end = time.monotonic() + HANG_S
        while demo.core.jobs.counts() != (1, 1):  # one runs (held), one waits
            assert time.monotonic() < end, demo.core.jobs.counts()
            time.sleep(0.05)
        out = Client(server, verbose=False).submit(prompt=PROMPT, max_new_tokens=8,
                                                   api_name="/generate").result(timeout=HANG_S)
        assert out["mars"]["stats"]["tokens"] > 0
        assert demo.core.jobs.counts() == (1, 1) and not any(j.done() for j in jobs)  # it waited for neither
    finally:
        release.set()
    for j in jobs:
        j.result(timeout=300)
