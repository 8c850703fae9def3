"""Tau that follows the load: what a server sets the threshold to before each forward.

The paper's serving claim (spec section 3): a server relaxes tau when it is busy and tightens it
when it is idle, with no model swap. A policy is any callable `policy(load) -> tau`, called
once per forward of a continuous batch (`mars_core.serving`). `FixedTau` is the trivial one;
`AdaptiveTau` walks a ladder of tau values between the operator's bounds.

`AdaptiveTau` is pure: no clock, no I/O, no torch. Its output depends only on the loads it was
shown, so it is tested with scripted loads and replays exactly.

Pressure, the one number it reacts to, is the latency a request arriving now can expect, as a
fraction of the operator's `latency_target` (seconds from arrival to the last token):

    service  = reply_tokens * token_latency     decoding one typical reply at today's pace
    pressure = max(1, backlog / slots) * service / latency_target

token_latency is measured: the recent seconds per generated token a running request sees
(forward time / tokens it accepted), so the policy reacts to a slower machine (contention, a
longer context, a bigger batch) as well as to the queue; reply_tokens is the recent average
length of finished replies; backlog / slots > 1 means a queue, and a newcomer waits for about
backlog / slots - 1 rounds of service before it starts.

Hysteresis, so that it does not oscillate:
- relax (one rung looser) when pressure >= `high` for `patience` forwards in a row and the
  backlog has not shrunk since the last relaxation (a queue that is draining needs no looser
  tau; the reference is forgotten once pressure falls below `high`);
- tighten (one rung stricter) when the pressure *predicted at the stricter rung* is <= `low`
  for `tighten_patience` forwards in a row. A stricter tau emits fewer tokens per forward
  (measured at each rung; 1 at tau = 1), so a request holds its row r = tokens-per-forward here
  / tokens-per-forward there times longer and about backlog * r rows would be busy; the
  prediction takes the forward time measured at the stricter rung with that many rows (the
  nearest larger count it has seen; failing that, today's forward time, which overestimates:
  a stricter forward is never dearer), divides by its tokens per forward, and scales by the
  queue as above. The backlog here is averaged over about `tighten_patience` forwards (the
  number of running requests jumps as single requests come and go). low < high leaves a band
  for the prediction's error, so a move does not undo itself.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from .config import METRICS, _check_int, check_tau


@dataclass(frozen=True)
class Load:
    """What a serving loop knows just before a forward.

    waiting:        requests queued, not admitted yet
    running:        requests decoding (rows of the coming forward)
    slots:          rows the batch can hold
    step_seconds:   wall time of the previous forward step (None before the first)
    tokens_per_row: tokens each running request accepted in that step, on average (None: idem)
    reply_tokens:   recent average length of finished replies, tokens (None: none finished yet)
    """

    waiting: int
    running: int
    slots: int
    step_seconds: float | None = None
    tokens_per_row: float | None = None
    reply_tokens: float | None = None


class FixedTau:
    """The same tau for every forward, whatever the load."""

    def __init__(self, tau: float, metric: str = "probability"):
        self.tau = check_tau(tau, metric)
        self.metric = metric

    def __call__(self, load: Load) -> float:
        return self.tau

    def __repr__(self) -> str:
        return f"FixedTau({self.tau:g})"


@dataclass(frozen=True)
class AdaptiveConfig:
    """Operator bounds and the controller's constants (see the module docstring).

    tau_min, tau_max:  the range tau may move in. For probability / margin tau_max is the strict
                       end (1.0: exactly AR) and tau_min the fastest allowed; for entropy the
                       strict end is tau_min.
    step:              spacing of the ladder of tau values, from the strict end to the loose end
                       (the loose bound is always the last rung).
    latency_target:    seconds from a request's arrival to its last token the operator aims at.
    high, low:         pressure thresholds (fractions of the target), 0 < low < high. The
                       pressure is an expected latency and the target usually a tail (p95), so
                       `high` sits well below 1.
    patience:          forwards in a row at pressure >= high before relaxing one rung.
    tighten_patience:  forwards in a row at predicted pressure <= low before tightening one rung.
    window:            steps whose median per-token latency the policy reads: a median, so that
                       one forward the OS preempted (tens of ms on a shared CPU) does not move
                       tau, while a machine slow for half the window does.
    smoothing:         weight of the newest step in the tokens-per-forward averages, in (0, 1].
    """

    tau_min: float = 0.7
    tau_max: float = 1.0
    step: float = 0.05
    latency_target: float = 2.0
    high: float = 0.5
    low: float = 0.4
    patience: int = 8
    tighten_patience: int = 32
    window: int = 16
    smoothing: float = 0.3
    metric: str = "probability"

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; allowed: {', '.join(METRICS)}")
        lo, hi = check_tau(self.tau_min, self.metric), check_tau(self.tau_max, self.metric)
        if lo > hi:
            raise ValueError(f"tau_min ({lo:g}) must be <= tau_max ({hi:g})")
        for name in ("step", "latency_target", "high", "low"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be < high ({self.high:g}): the gap is the hysteresis band")
        _check_int("patience", self.patience, 1)
        _check_int("tighten_patience", self.tighten_patience, 1)
        _check_int("window", self.window, 1)
        s = self.smoothing
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {s!r}")

    def ladder(self) -> list[float]:
        """The tau values, strict end first."""
        strict, loose = (self.tau_min, self.tau_max) if self.metric == "entropy" else (self.tau_max, self.tau_min)
        sign = 1 if loose > strict else -1
        n = int(math.floor(abs(loose - strict) / self.step + 1e-9))
        rungs = [round(strict + sign * i * self.step, 6) for i in range(n + 1)]
        return rungs if rungs[-1] == round(loose, 6) else rungs + [round(loose, 6)]


class AdaptiveTau:
    """Relax tau under load, tighten it when idle, within the operator's bounds."""

    def __init__(self, config: AdaptiveConfig | None = None, **overrides):
        if config is not None and overrides:
            raise ValueError("pass either an AdaptiveConfig or keyword overrides, not both")
        self.config = config if config is not None else AdaptiveConfig(**overrides)
        self.metric = self.config.metric
        self.ladder = self.config.ladder()
        self.level = 0  # index into the ladder: 0 is the strict end
        self.recent: deque[float] = deque(maxlen=self.config.window)  # seconds per token, latest steps
        self.tpf = [1.0] + [None] * (len(self.ladder) - 1)  # tokens per row per forward at each rung
        self.cost: list[dict[int, deque]] = [{} for _ in self.ladder]  # rung -> rows -> forward seconds
        self.rows = 0  # rows of the forward the last call was made for
        self.streak = 0  # forwards in a row that asked for the same move (+: relax, -: tighten)
        self.backlog_at_move = 0
        self.backlog = None  # slow moving average of waiting + running, for tightening
        self.pressure = 0.0  # the last pressure seen, for plots and logs

    @property
    def tau(self) -> float:
        return self.ladder[self.level]

    @property
    def latency(self) -> float:
        """Median seconds per token over the recent steps at this rung (0 before any)."""
        return statistics.median(self.recent) if self.recent else 0.0

    def _observe(self, load: Load) -> None:
        a = self.config.smoothing
        if load.step_seconds is not None and load.tokens_per_row:
            self.recent.append(load.step_seconds / load.tokens_per_row)
            if self.rows:
                self.cost[self.level].setdefault(self.rows, deque(maxlen=8)).append(load.step_seconds)
            if self.level > 0:  # the strict rung is one token per forward by definition
                old = self.tpf[self.level]
                self.tpf[self.level] = load.tokens_per_row if old is None else (1 - a) * old + a * load.tokens_per_row
        self.rows = load.running

    def _forward_cost(self, level: int, rows: int) -> float | None:
        """Median forward seconds seen at rung `level` with `rows` rows (or the nearest more)."""
        seen = sorted(n for n in self.cost[level] if n >= rows)
        return statistics.median(self.cost[level][seen[0]]) if seen else None

    def _predicted(self, backlog: float, slots: int, reply: float) -> float:
        """Pressure expected one rung stricter (see the module docstring)."""
        cfg = self.config
        r = (self.tpf[self.level] or 1.0) / (self.tpf[self.level - 1] or 1.0)
        busy = backlog * r
        rows = min(slots, max(1, math.ceil(busy)))
        here = self._forward_cost(self.level, rows) or self.latency * (self.tpf[self.level] or 1.0)
        there = self._forward_cost(self.level - 1, rows)
        step = min(there, here) if there is not None else here
        return max(1.0, busy / slots) * reply * step / (self.tpf[self.level - 1] or 1.0) / cfg.latency_target

    def __call__(self, load: Load) -> float:
        cfg = self.config
        self._observe(load)
        backlog, slots = load.waiting + load.running, max(load.slots, 1)
        slow = 2 / (cfg.tighten_patience + 1)
        self.backlog = backlog if self.backlog is None else (1 - slow) * self.backlog + slow * backlog
        reply = load.reply_tokens or 0.0
        self.pressure = max(1.0, backlog / slots) * reply * self.latency / cfg.latency_target
        want = 0
        if self.pressure >= cfg.high and self.level < len(self.ladder) - 1 and backlog >= self.backlog_at_move:
            want = 1
        elif self.level > 0 and self._predicted(self.backlog, slots, reply) <= cfg.low:
            want = -1
        self.streak = self.streak + want if want and (self.streak * want) >= 0 else want
        if self.streak >= cfg.patience or -self.streak >= cfg.tighten_patience:
            self.level += 1 if self.streak > 0 else -1
            self.streak = 0
            self.backlog_at_move = backlog
            self.recent.clear()  # measured afresh at the new rung (else its lag would overshoot)
        if self.pressure < cfg.high:
            self.backlog_at_move = 0  # the episode is over: the next rise starts afresh
        return self.tau

    def __repr__(self) -> str:
        c = self.config
        return f"AdaptiveTau({c.tau_max:g}..{c.tau_min:g}, target {c.latency_target:g} s)"
