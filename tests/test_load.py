"""The load simulation: seeded arrivals, bounded runs, clear errors, and its outputs."""
import json

import pytest

from benchmarks import load as load_cmd
from benchmarks.load import parse_policy, run_load, settings_from
from benchmarks.load_report import front_figure, table, timeline_figure, write_outputs
from benchmarks.load_sim import LoadSettings, arrivals, pct, simulate
from conftest import make_model
from mars_core import DecodeConfig
from mars_core.serving import Batcher
from mars_core.tau_policy import AdaptiveConfig


@pytest.fixture(scope="module")
def tiny(tokenizer):
    m = make_model("qwen2", len(tokenizer))
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m


def test_bad_settings_are_refused():
    for kwargs, msg in [(dict(rate=0), "rate"), (dict(rate=-2), "rate"), (dict(rate=float("inf")), "rate"),
                        (dict(pattern="spiky"), "pattern"), (dict(quiet_ratio=0), "quiet_ratio"),
                        (dict(duration=0), "duration"), (dict(max_requests=0), "max_requests"),
                        (dict(clock="sundial"), "clock"), (dict(time_limit=-1), "time_limit")]:
        with pytest.raises(ValueError, match=msg):
            LoadSettings(**kwargs)
    for spec in ["fast", "1.5", "fixed-", ""]:
        with pytest.raises(ValueError, match="policy|tau"):
            parse_policy(spec)
    assert [parse_policy(s) for s in ["0.95", "fixed-1.0", "Adaptive", "fixed 0.7"]] == \
        ["fixed 0.95", "fixed 1", "adaptive", "fixed 0.7"]


@pytest.mark.parametrize("args,msg", [(["--rate", "0"], "rate"), (["--pattern", "spiky"], "pattern"),
                                      (["--tau-min", "0.9", "--tau-max", "0.8"], "tau_min"),
                                      (["--policies", "0.95,turbo"], "turbo"), (["--slots", "0"], "slots"),
                                      (["--slots", "x"], "slots"), (["--low", "0.6", "--high", "0.5"], "low")])
def test_the_command_exits_with_a_one_line_error(args, msg, capsys):
    with pytest.raises(SystemExit) as e:
        load_cmd.main(args)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_arrivals_are_seeded_bounded_and_follow_the_pattern():
    s = LoadSettings(pattern="bursty", rate=40, quiet_ratio=0.25, duration=30, seed=3)
    a = arrivals(s)
    assert a == arrivals(s) and a != arrivals(LoadSettings(pattern="bursty", rate=40, quiet_ratio=0.25,
                                                           duration=30, seed=4))
    assert all(x[0] < y[0] for x, y in zip(a, a[1:])) and 0 <= a[0][0] and a[-1][0] < 30
    count = {name: sum(p == name for _, p in a) for name in ("quiet", "burst")}
    assert 320 < count["burst"] < 480 and 160 < count["quiet"] < 240  # 400 and 2 x 100 expected
    assert all(p == "burst" for t, p in a if 10 <= t < 20)
    assert len(arrivals(LoadSettings(rate=40, duration=30, max_requests=50))) == 50
    steady = arrivals(LoadSettings(pattern="steady", rate=10, duration=20))
    assert {p for _, p in steady} == {"steady"} and 150 < len(steady) < 250


def test_measured_clock_skips_idle_gaps_and_every_request_finishes(tiny, tokenizer):
    b = Batcher(tiny, tokenizer, DecodeConfig(tau=1.0, max_new_tokens=6), slots=2)
    times = [0.0, 0.0, 0.0, 50.0, 100.0]  # 100 s of arrivals
    raw = simulate(b, [[5, 6, 7]] * 5, times, LoadSettings(time_limit=60), 6)
    assert not raw["stopped"] and all(f is not None for f in raw["finish"])
    assert raw["wall_seconds"] < 30 and raw["steps"][-1]["t"] > 100  # the clock jumped, nobody slept
    assert all(f >= t for f, t in zip(raw["finish"], times)) and all(f <= g for f, g in zip(raw["first"], raw["finish"]))
    assert max(s["running"] for s in raw["steps"]) == 2 and raw["steps"][0]["waiting"] == 1


def test_wall_clock_sleeps_until_the_next_arrival(tiny, tokenizer):
    b = Batcher(tiny, tokenizer, DecodeConfig(tau=1.0, max_new_tokens=3), slots=2)
    raw = simulate(b, [[5, 6]] * 2, [0.0, 0.3], LoadSettings(clock="wall", time_limit=30), 3)
    assert raw["wall_seconds"] >= 0.3 and raw["first"][1] >= 0.3


def test_a_run_stops_at_its_time_limit(tiny, tokenizer):
    b = Batcher(tiny, tokenizer, DecodeConfig(tau=1.0, max_new_tokens=400), slots=1)
    raw = simulate(b, [[5, 6, 7]] * 50, [0.0] * 50, LoadSettings(time_limit=0.5), 400)
    assert raw["stopped"] and raw["wall_seconds"] < 5 and any(f is None for f in raw["finish"])


def test_run_load_compares_policies_on_the_same_requests(tiny, tokenizer, tmp_path):
    s = LoadSettings(pattern="bursty", rate=16, duration=0.9, seed=1)
    adaptive = AdaptiveConfig(latency_target=0.5)
    seen = []
    result = run_load(tiny, tokenizer, s, ["1.0", "0.5", "adaptive"], [1, 3], adaptive, block_size=4,
                      max_new_tokens=6, repeats=2, progress=lambda f, t: seen.append(f))
    runs = result["results"]
    assert [(r["policy"], r["slots"]) for r in runs] == [(p, n) for n in (1, 3) for p in ("fixed 1", "fixed 0.5", "adaptive")]
    n = len(arrivals(s))
    for r in runs:
        assert r["requests"] == n and r["finished"] == n and len(r["repeats"]) == 2
        assert r["p50_latency"] <= r["p95_latency"] and r["p50_ttft"] <= r["p95_ttft"]
        assert r["accuracy"] is not None and 0 < r["tokens_per_forward"] <= 4
    assert runs[0]["mean_tau"] == 1.0 and runs[1]["mean_tau"] == 0.5
    assert seen and max(seen) <= 1.0
    paths = write_outputs(result, str(tmp_path))
    assert json.loads(open(paths["json"]).read())["settings"]["target"] == 0.5
    text = table(result)
    assert "fixed 0.5" in text and "p95 latency" in text and "repetitions" in text
    assert len(timeline_figure(result).data) == 3 * len(runs) and len(front_figure(result).data) == len(runs)


def test_settings_from_the_command_line_defaults():
    s, adaptive, policies, slots = settings_from(load_cmd.parser().parse_args([]))
    assert s.pattern == "bursty" and policies == ["1.0", "0.95", "0.7", "adaptive"] and slots == [4]
    assert adaptive.tau_min == 0.7 and adaptive.tau_max == 1.0


def test_percentiles():
    assert pct([], 0.5) is None and pct([3.0], 0.95) == 3.0
    assert pct([1, 2, 3, 4], 0.5) == 2.5 and pct(list(range(101)), 0.95) == 95


def _raw(latencies, stopped=False):
    n = len(latencies)
    return {"finish": list(latencies), "first": [0.5] * n, "outs": [[1, 2]] * n, "taus": [[1.0]] * n,
            "stopped": stopped, "row_forwards": 2 * n, "forwards": n, "wall_seconds": 1.0, "steps": [{"t": 1.0}]}


def test_the_verdict_is_the_p95_latency_against_the_target():
    """Requests arriving at t = 0 that finish 1, 2, ..., 20 s later: p95 = 19.05 s by interpolation,
    median 10.5 s. The verdict is p95 <= target, and a run cut by its time limit never meets it."""
    from benchmarks.load_sim import summarise

    lat = [float(x) for x in range(1, 21)]
    arr = [(0.0, "steady")] * 20
    verdict = lambda target, stopped=False: summarise(_raw(lat, stopped), arr, [None] * 20, [None] * 20,
                                                      target)["meets_target"]
    assert verdict(19.05) and verdict(25.0)
    assert not verdict(19.0) and not verdict(11.0)  # the median (10.5) would pass 11 s
    assert not verdict(25.0, stopped=True)
    s = summarise(_raw(lat), arr, [None] * 20, [None] * 20, 19.05)
    assert s["p95_latency"] == pytest.approx(19.05) and s["p50_latency"] == 10.5 and s["finished"] == 20
