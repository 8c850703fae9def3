"""The load simulation's parts: settings, seeded arrivals, the clock, one simulated run, its summary.

The clock. Requests arrive on a clock while the model decodes, as at a real server, and the
server admits them between forwards. The "measured" clock advances by the measured wall time of
every step (admission, forward, acceptance, retirement: everything the server does) and jumps
over idle gaps to the next arrival instead of sleeping: the latencies are those of a real
server on this machine, and a quiet phase costs no wall time. The "wall" clock reads the real
clock and sleeps when idle (slower; the two differ only by the sleeping and by the time between
steps). Either way the forward times are real, so other jobs on the machine show up as latency,
and an adaptive policy reacts to them as it would in production.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass

PATTERNS = ("steady", "bursty")
CLOCKS = ("measured", "wall")


@dataclass(frozen=True)
class LoadSettings:
    """What arrives and for how long. Validated: a bad setting raises ValueError."""

    pattern: str = "bursty"
    rate: float = 7.5  # requests/s: the steady rate, or the burst's
    quiet_ratio: float = 0.25  # bursty: the quiet phases' rate as a share of `rate`
    duration: float = 60.0  # seconds of arrivals (bursty: thirds quiet, burst, quiet)
    max_requests: int = 600
    seed: int = 0
    clock: str = "measured"
    time_limit: float = 300.0  # wall seconds per run, then it stops

    def __post_init__(self):
        if self.pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {self.pattern!r}; allowed: {', '.join(PATTERNS)}")
        if self.clock not in CLOCKS:
            raise ValueError(f"unknown clock {self.clock!r}; allowed: {', '.join(CLOCKS)}")
        for name in ("rate", "duration", "time_limit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        q = self.quiet_ratio
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
            raise ValueError(f"quiet_ratio must be in (0, 1], got {q!r}")
        for name, lo in (("max_requests", 1), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


def phases(s: LoadSettings) -> list[tuple[str, float, float, float]]:
    """(name, start, end, rate) of each phase."""
    if s.pattern == "steady":
        return [("steady", 0.0, s.duration, s.rate)]
    third, quiet = s.duration / 3, s.rate * s.quiet_ratio
    return [("quiet", 0.0, third, quiet), ("burst", third, 2 * third, s.rate), ("quiet", 2 * third, s.duration, quiet)]


def arrivals(s: LoadSettings) -> list[tuple[float, str]]:
    """Seeded Poisson arrivals: (time in seconds, phase name), sorted, at most max_requests."""
    rng = random.Random(f"mars-load:{s.seed}")
    out = []
    for name, start, end, rate in phases(s):
        t = start + rng.expovariate(rate)
        while t < end and len(out) < s.max_requests:
            out.append((t, name))
            t += rng.expovariate(rate)
    return out


class MeasuredClock:
    """Advanced by the measured duration of each step; idle gaps are skipped, not slept."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


class WallClock:
    """The real clock: time passes while the model decodes, and the server sleeps when idle."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def advance(self, seconds: float) -> None:
        pass

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))


def simulate(batcher, prompts: list[list[int]], times: list[float], settings: LoadSettings,
             max_new_tokens: int, progress=None) -> dict:
    """Serve `prompts[i]` arriving at `times[i]` through `batcher`; returns raw records.

    Records: per request its arrival, first-token and finish times (clock seconds) and token
    ids; per step the clock, tau, queue and rows. `progress(fraction, text)` is called now and
    then. Stops when every request is done, or after `settings.time_limit` wall seconds.
    """
    from mars_core.serving import Request

    clock = MeasuredClock() if settings.clock == "measured" else WallClock()
    wall0 = time.perf_counter()
    n, nxt = len(prompts), 0
    rid_of: dict[int, int] = {}  # batcher id -> index
    first = [None] * n
    finish = [None] * n
    steps = []
    stopped = False
    while nxt < n or not batcher.idle:
        if time.perf_counter() - wall0 > settings.time_limit:
            stopped = True
            break
        while nxt < n and times[nxt] <= clock.now():
            rid_of[batcher.submit(Request(prompts[nxt], max_new_tokens, seed=nxt))] = nxt
            nxt += 1
        if batcher.idle:
            clock.wait_until(times[nxt])
            continue
        step = batcher.step()
        if step is None:
            continue
        clock.advance(step.seconds)
        now = clock.now()
        for ev in step.events:
            i = rid_of[ev.request_id]
            if first[i] is None and ev.tokens:
                first[i] = now
            if ev.finished:
                finish[i] = now
        steps.append({"t": now, "tau": step.tau, "waiting": step.waiting, "running": step.running,
                      "tokens": step.tokens, "seconds": step.seconds})
        if progress is not None and len(steps) % 25 == 0:
            done = sum(f is not None for f in finish)
            progress(done / n, f"{done}/{n} requests done, clock {now:.1f} s")
    if progress is not None:
        done = sum(f is not None for f in finish)
        progress(done / n, f"{done}/{n} requests done" + (" (stopped at the time limit)" if stopped else ""))
    state = {i: batcher.done.get(r) for r, i in rid_of.items()}
    outs = [state[i].out if state.get(i) is not None and finish[i] is not None else None for i in range(n)]
    taus = [state[i].taus if state.get(i) is not None else [] for i in range(n)]
    return {"first": first, "finish": finish, "outs": outs, "taus": taus, "steps": steps, "stopped": stopped,
            "wall_seconds": time.perf_counter() - wall0, "forwards": len(steps),
            "row_forwards": sum(len(t) for t in taus)}


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarise(raw: dict, arr: list[tuple[float, str]], texts: list[str | None], correct: list[bool | None],
              target: float) -> dict:
    """Latency percentiles, throughput, tokens per forward and accuracy (overall, per phase)."""
    n = len(arr)
    done = [i for i in range(n) if raw["finish"][i] is not None]
    lat = [raw["finish"][i] - arr[i][0] for i in done]
    ttft = [raw["first"][i] - arr[i][0] for i in range(n) if raw["first"][i] is not None]
    tokens = sum(len(raw["outs"][i]) for i in done)
    span = (max(raw["finish"][i] for i in done) - arr[0][0]) if done else 0.0
    by_phase = {}
    for name in dict.fromkeys(p for _, p in arr):
        idx = [i for i in done if arr[i][1] == name]
        ok = [correct[i] for i in idx if correct[i] is not None]
        pl = [raw["finish"][i] - arr[i][0] for i in idx]
        by_phase[name] = {"requests": len(idx), "accuracy": sum(ok) / len(ok) if ok else None,
                          "p95_latency": pct(pl, 0.95)}
    ok = [correct[i] for i in done if correct[i] is not None]
    all_taus = [t for i in done for t in raw["taus"][i]]
    return {
        "requests": n, "finished": len(done), "unfinished": n - len(done), "stopped_by_time_limit": raw["stopped"],
        "p50_ttft": pct(ttft, 0.5), "p95_ttft": pct(ttft, 0.95),
        "p50_latency": pct(lat, 0.5), "p95_latency": pct(lat, 0.95), "max_latency": max(lat) if lat else None,
        "meets_target": (pct(lat, 0.95) <= target and not raw["stopped"]) if lat else False,
        "tokens": tokens, "tokens_per_second": tokens / span if span > 0 else 0.0,
        "tokens_per_forward": tokens / raw["row_forwards"] if raw["row_forwards"] else 0.0,
        "forwards": raw["forwards"], "mean_tau": statistics.fmean(all_taus) if all_taus else None,
        "accuracy": sum(ok) / len(ok) if ok else None, "by_phase": by_phase,
        "wall_seconds": raw["wall_seconds"], "clock_seconds": raw["steps"][-1]["t"] if raw["steps"] else 0.0,
    }


