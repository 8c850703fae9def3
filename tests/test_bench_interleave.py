"""The benchmark's clock: a machine whose speed drifts during a run must not favour the method
that happened to run while it was fast (this CPU's speed moved up to 2x within a minute)."""
import types

import torch

from benchmarks import measure
from benchmarks.methods import Method


def _drifting_machine(monkeypatch):
    """A fake clock: every decode takes 1 s plus 0.1 s per decode run before it (a machine that
    keeps slowing down); returns the log of (method, first prompt id) in the order they ran."""
    clock, log = [0.0], []
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def run(method, model, tok, chunk, tau, args, counter):
        clock[0] += 1.0 + 0.1 * len(log)
        log.append((method.name, chunk[0][0]))
        return [[7] for _ in chunk], len(chunk)

    return run, log


def test_a_drifting_machine_slows_every_method_alike(monkeypatch):
    run, log = _drifting_machine(monkeypatch)
    a, b = Method("a", "ar", run), Method("b", "ar", run)  # the same decoder twice
    ids = {"ar": [[i] for i in range(8)]}
    measured = measure._measure_batch([(a, None), (b, None)], {"ar": (torch.nn.Identity(), None)}, ids, 1,
                                      types.SimpleNamespace(repeats=1))
    sa, sb = measured[("a", None)][0]["seconds"], measured[("b", None)][0]["seconds"]
    # one method after the other: 10.8 s against 17.2 s; chunk by chunk, within 2%
    assert abs(sa / sb - 1) < 0.02, (sa, sb)
    timed = log[2:]  # after the warm-up of each
    assert [p for _, p in timed] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert [m for m, _ in timed[:4]] == ["a", "b", "b", "a"]  # the order rotates from chunk to chunk
    assert measured[("a", None)][0]["ids"] == [[7]] * 8 and measured[("a", None)][0]["row_forwards"] == 8


def test_a_method_failing_mid_repetition_has_no_measurement(monkeypatch):
    run, log = _drifting_machine(monkeypatch)

    def flaky(method, model, tok, chunk, tau, args, counter):
        if chunk[0][0] == 5 and len(log) > 4:  # fails on a later chunk, after its warm-up
            raise RuntimeError("out of memory")
        return run(method, model, tok, chunk, tau, args, counter)

    ok, bad = Method("ok", "ar", run), Method("bad", "ar", flaky, optional=True)
    measured = measure._measure_batch([(ok, None), (bad, None)], {"ar": (torch.nn.Identity(), None)},
                                      {"ar": [[i] for i in range(8)]}, 1, types.SimpleNamespace(repeats=2))
    assert measured[("bad", None)] == [] and "out of memory" in bad.state["error"]
    assert len(measured[("ok", None)]) == 2 and all(len(r["ids"]) == 8 for r in measured[("ok", None)])
