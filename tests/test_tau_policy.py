"""The tau policy: bounds, the ladder, reaction to queue and latency, and no oscillation."""
import random

import pytest

from mars_core.tau_policy import AdaptiveConfig, AdaptiveTau, FixedTau, Load

LADDER = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7]


def test_config_is_validated():
    bad = [(dict(tau_min=0.9, tau_max=0.8), "tau_min"), (dict(tau_max=1.2), "tau"),
           (dict(low=1.0, high=1.0), "low"), (dict(step=0), "step"), (dict(latency_target=-1), "latency_target"),
           (dict(latency_target=float("nan")), "latency_target"), (dict(patience=0), "patience"),
           (dict(tighten_patience=1.5), "tighten_patience"), (dict(smoothing=0), "smoothing"),
           (dict(metric="logit"), "metric"), (dict(tau_min="x"), "number")]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            AdaptiveConfig(**kwargs)
    with pytest.raises(ValueError, match="tau"):
        FixedTau(1.5)
    with pytest.raises(ValueError, match="either"):
        AdaptiveTau(AdaptiveConfig(), patience=3)
    with pytest.raises(AttributeError):
        AdaptiveConfig().tau_min = 0.1  # frozen


def test_ladder_runs_from_the_strict_end_to_the_loose_bound():
    assert AdaptiveConfig().ladder() == LADDER
    assert AdaptiveConfig(tau_min=0.72, tau_max=0.9, step=0.05).ladder() == [0.9, 0.85, 0.8, 0.75, 0.72]
    assert AdaptiveConfig(tau_min=0.0, tau_max=1.0, step=0.5, metric="entropy").ladder() == [0.0, 0.5, 1.0]
    assert AdaptiveConfig(tau_min=0.9, tau_max=0.9).ladder() == [0.9]
    assert AdaptiveTau(tau_min=0.9, tau_max=0.9)(Load(100, 8, 8)) == 0.9  # one rung: never moves


def test_fixed_ignores_the_load():
    p = FixedTau(0.7)
    assert {p(Load(w, 8, 8, 1.0, 1.0)) for w in range(50)} == {0.7}


def test_idle_stays_strict_and_a_growing_queue_relaxes_one_rung_per_patience():
    p = AdaptiveTau(latency_target=1.0, patience=4)
    # one request, 2 ms per token, 70-token replies: 0.14 s expected, pressure 0.14
    assert {p(Load(0, 1, 8, 0.002, 1.0, 70)) for _ in range(50)} == {1.0}
    # a queue that keeps growing and a forward that never gets faster (6 ms, one token each)
    taus = [p(Load(w, 8, 8, 0.006, 1.0, 70)) for w in range(60)]
    assert all(a >= b for a, b in zip(taus, taus[1:]))  # monotone
    changes = [i for i in range(1, len(taus)) if taus[i] != taus[i - 1]]
    assert len(changes) == len(LADDER) - 1 and all(b - a == 4 for a, b in zip(changes, changes[1:]))
    assert taus[-1] == 0.7  # the operator's bound, and no further


def test_a_draining_queue_is_not_relaxed_further():
    p = AdaptiveTau(latency_target=1.0, patience=2)
    for w in range(6):  # a queue builds: relaxed once or more
        p(Load(w, 8, 8, 0.006, 1.0, 70))
    level = p.tau
    assert level < 1.0
    taus = [p(Load(w, 8, 8, 0.006, 1.0, 70)) for w in range(5, 0, -1)]  # still high, but shrinking
    assert set(taus) == {level}


def test_measured_latency_alone_relaxes_and_the_prediction_holds_it():
    """No queue, a slow machine: the expected latency over `high` relaxes tau; once relaxed, the
    lower latency does not tighten it back while tau = 1 would be too slow again."""
    p = AdaptiveTau(latency_target=1.0, patience=3, tighten_patience=5, low=0.25)

    def run(n, strict_secs, loose_secs):
        out = []
        for _ in range(n):
            strict = p.tau == 1.0
            out.append(p(Load(0, 2, 8, strict_secs if strict else loose_secs, 1.0 if strict else 3.4, 70)))
        return out

    taus = run(200, 0.015, 0.02)  # 1.05 s per reply at tau 1; 0.41 s at 0.95
    assert taus[0] == 1.0 and taus[-1] == 0.95 and moves(taus) == 1
    taus = run(200, 0.004, 0.004)  # faster, but tau 1 would predict 0.28 s, over low = 0.25
    assert set(taus) == {0.95}
    taus = run(200, 0.002, 0.002)  # fast: predicted 0.14 s at tau 1
    assert taus[-1] == 1.0 and moves(taus) == 1


def test_pressure_inside_the_band_never_moves_tau():
    p = AdaptiveTau(latency_target=1.0, low=0.25, high=0.5)
    p.level = 1
    p.tpf[1] = 1.0  # here as fast as the strict rung: predicted pressure = pressure
    rng = random.Random(0)
    taus = [p(Load(0, rng.randint(1, 8), 8, rng.uniform(0.004, 0.006), 1.0, 70)) for _ in range(500)]
    assert set(taus) == {0.95}  # pressure 0.28..0.42 throughout


def fluid_server(policy, rate, steps=4000, seed=None, slots=8, reply=70):
    """A server in miniature: arrivals at `rate` per second (evenly spaced, or Poisson when
    `seed` is given), replies of `reply` tokens, a forward costing more with more rows and with
    masks, and the tokens per forward the bundled model shows at each rung (1 at tau = 1, 3.4
    at 0.95). Capacity: about 19 requests/s at tau 1, 43 at 0.95, 47 at 0.7."""
    rng = random.Random(seed)
    tpf = {1.0: 1.0, 0.95: 3.4, 0.9: 3.5, 0.85: 3.55, 0.8: 3.6, 0.75: 3.6, 0.7: 3.65}
    waiting, running, last, taus = 0, [], (None, None), []
    clock, next_arrival = 0.0, 0.0
    for _ in range(steps):
        while waiting and len(running) < slots:
            waiting -= 1
            running.append(reply)
        tau = policy(Load(waiting, len(running), slots, *last, reply))
        taus.append(tau)
        secs = (0.002 + 0.0005 * len(running)) * (1.0 if tau == 1.0 else 1.5)
        running = [r - tpf[tau] for r in running if r - tpf[tau] > 0]
        clock += secs
        while next_arrival <= clock:
            waiting += 1
            next_arrival += rng.expovariate(rate) if seed is not None else 1 / rate
        last = (secs, tpf[tau])
    return taus


def moves(taus):
    return sum(a != b for a, b in zip(taus, taus[1:]))


@pytest.mark.parametrize("rate,settles", [(5, {1.0}), (17, {1.0}), (25, {0.95}), (40, {0.95}), (80, {0.7})])
def test_a_steady_load_settles_on_one_rung(rate, settles):
    """Evenly spaced arrivals: after a few moves the policy stays on the one rung that keeps up
    (the strict one when it can), with no limit cycle."""
    taus = fluid_server(AdaptiveTau(latency_target=1.0), rate)
    assert moves(taus) <= 8 and set(taus[len(taus) // 2:]) == settles, (rate, moves(taus))


@pytest.mark.parametrize("rate", [15, 25, 35])
def test_poisson_load_near_capacity_does_not_chatter(rate):
    """Random arrivals around tau 1's capacity: tau dips during the random peaks and comes back,
    but each dip lasts hundreds of forwards (no flapping between rungs)."""
    for seed in range(3):
        taus = fluid_server(AdaptiveTau(latency_target=2.0), rate, steps=6000, seed=seed)
        assert moves(taus) <= 40, (rate, seed, moves(taus))
        assert min(taus) >= 0.9


def test_same_loads_same_taus():
    loads = [Load(random.Random(i).randint(0, 20), 8, 8, 0.003, 2.0) for i in range(300)]
    assert [AdaptiveTau()(x) for x in loads[:1]] == [AdaptiveTau()(x) for x in loads[:1]]
    a, b = AdaptiveTau(), AdaptiveTau()
    assert [a(x) for x in loads] == [b(x) for x in loads]


def test_a_preempted_forward_does_not_move_tau_but_a_slow_machine_does():
    """The latency is a median over `window` steps: isolated 60 ms forwards (the OS gave the core
    to another job) among 4 ms ones leave tau alone; a machine slow for most steps relaxes it."""
    p = AdaptiveTau(latency_target=1.0, window=16)
    taus = [p(Load(0, 2, 8, 0.06 if i % 5 == 0 else 0.004, 1.0, 70)) for i in range(400)]
    assert set(taus) == {1.0}
    taus = [p(Load(0, 2, 8, 0.004 if i % 5 == 0 else 0.06, 1.0, 70)) for i in range(400)]
    assert taus[-1] < 1.0


def test_tightening_uses_the_forward_time_measured_at_the_stricter_rung():
    """At tau 1 a forward carries no masks and costs less (4 ms here against 8 ms): back in a
    quiet phase, the policy predicts tau 1 from what tau 1 cost, not from today's MARS forward
    (which would predict 0.56 s per reply, over `low`, and keep tau relaxed for good)."""
    p = AdaptiveTau(latency_target=1.0, patience=2, tighten_patience=4)

    def step(waiting, running):
        strict = p.tau == 1.0
        return p(Load(waiting, running, 8, 0.004 if strict else 0.008, 1.0 if strict else 3.4, 70))

    for _ in range(20):
        step(0, 1)  # quiet, tau 1: 70 tokens x 4 ms = 0.28 s per reply
    for w in range(20):
        step(w, 8)  # a queue builds
    assert p.tau < 1.0
    taus = [step(0, 1) for _ in range(300)]
    assert taus[-1] == 1.0


def test_the_cost_lookup_takes_the_nearest_larger_batch_seen():
    """A forward's time is recorded under the rung and row count of the forward it measured (the
    previous call's); the lookup takes the median at that count, else at the nearest larger one."""
    from collections import deque

    p = AdaptiveTau(AdaptiveConfig(tau_min=0.8, tau_max=1.0, step=0.1))
    p(Load(waiting=0, running=3, slots=8))
    p(Load(waiting=0, running=5, slots=8, step_seconds=0.2, tokens_per_row=1.0))
    assert {n: list(v) for n, v in p.cost[0].items()} == {3: [0.2]}  # 3 rows ran the measured forward
    p.cost[1] = {2: deque([0.1, 0.3, 0.2]), 4: deque([0.4]), 8: deque([0.5, 0.7])}
    assert p._forward_cost(1, 2) == 0.2 and p._forward_cost(1, 1) == 0.2
    assert p._forward_cost(1, 3) == 0.4 and p._forward_cost(1, 5) == 0.6
    assert p._forward_cost(1, 9) is None and p._forward_cost(2, 1) is None


def test_pressure_exactly_at_high_relaxes():
    """Relax when pressure >= high: here pressure = 10 tokens x 0.1 s per token / 2 s = 0.5 = high
    exactly (all exact in binary floating point), for `patience` forwards."""
    cfg = AdaptiveConfig(tau_min=0.8, tau_max=1.0, step=0.1, latency_target=2.0, high=0.5, low=0.4, patience=3)
    at_high = Load(waiting=0, running=1, slots=4, step_seconds=0.1, tokens_per_row=1.0, reply_tokens=10.0)
    p = AdaptiveTau(cfg)
    taus = [p(at_high) for _ in range(3)]
    assert p.pressure == 0.5 and taus == [1.0, 1.0, 0.9]
    below = AdaptiveTau(cfg)
    assert [below(Load(0, 1, 4, 0.1, 1.0, 9.0)) for _ in range(6)] == [1.0] * 6  # pressure 0.45


def test_the_strict_rung_is_one_token_per_forward_by_definition():
    """Tokens per forward at tau = 1 is 1 whatever a step reports (an EOS-only step reports less):
    only the looser rungs are measured."""
    p = AdaptiveTau(AdaptiveConfig(tau_min=0.8, tau_max=1.0, step=0.1))
    for tpr in (0.5, 2.0, 0.7):
        p(Load(waiting=0, running=2, slots=4, step_seconds=0.1, tokens_per_row=tpr, reply_tokens=10.0))
    assert p.level == 0 and p.tpf[0] == 1.0
