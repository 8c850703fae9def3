"""Decoding configuration and the live `tau` control.

`DecodeConfig` is frozen and validated once; `TauControl` is the one mutable knob, read by the
decoders before every forward so that a caller (a UI slider, a serving system under load) can
change the acceptance threshold in the middle of a generation.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

MODES = ("ar", "mars")
CACHES = ("none", "sliding", "block", "cursor")
METRICS = ("probability", "entropy", "margin")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_tau(tau: float, metric: str) -> float:
    """Return `tau` as a float or raise a ValueError saying which range `metric` allows."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    try:
        tau = float(tau)
    except (TypeError, ValueError):
        raise ValueError(f"tau must be a number, got {tau!r}") from None
    if not math.isfinite(tau):
        raise ValueError(f"tau must be finite, got {tau}")
    if metric == "entropy":
        if tau < 0:
            raise ValueError(f"tau for the entropy metric must be >= 0 (nats), got {tau}")
    elif not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau for the {metric} metric must be in [0, 1], got {tau}")
    return tau


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode.

    mode:             "ar" (one token per forward) or "mars" (a block of `block_size` predictions
                      per forward, accepted left to right while confident).
    tau:              acceptance threshold. probability / margin: accept while conf >= tau, in
                      [0, 1]; entropy: accept while H <= tau (nats), >= 0. The strictest setting
                      (tau = 1 for probability / margin, tau = 0 for entropy) accepts exactly one
                      token per step, i.e. it is AR decoding.
    block_size:       B, predictions per forward (ignored, i.e. 1, in "ar" mode).
    cache:            "none" (full recompute, the reference), "sliding" (KV cache of the
                      committed prefix), "block" (the paper's block-level cache for batches),
                      "cursor" (per-sequence write cursors, no block synchronisation; see
                      `decode_cursor`).
    cache_block_size: B_cache for cache="block"; must be >= block_size.
    metric:           "probability", "entropy" or "margin".
    temperature:      0 is greedy; > 0 samples (seeded per sequence by `seed`).
    max_new_tokens:   generated tokens per sequence, EOS excluded from the count's cap.
    max_accept:       optional cap on tokens accepted per step (None: block_size).
    compile:          False (eager), True, or a `torch.compile` mode (one of COMPILE_MODES):
                      the cursor cache's static-shape path (`decode_compiled`), compiled once
                      per batch-size bucket. True picks "reduce-overhead" (CUDA graphs) on a
                      CUDA device and "default" elsewhere. Needs cache="cursor".
    """

    mode: str = "mars"
    tau: float = 0.95
    block_size: int = 4
    cache: str = "sliding"
    cache_block_size: int = 16
    metric: str = "probability"
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0
    max_accept: int | None = None
    compile: bool | str = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if self.cache not in CACHES:
            raise ValueError(f"unknown cache mode {self.cache!r}; allowed: {', '.join(CACHES)}")
        check_tau(self.tau, self.metric)
        _check_int("block_size", self.block_size, 1)
        _check_int("cache_block_size", self.cache_block_size, 1)
        _check_int("max_new_tokens", self.max_new_tokens, 1)
        _check_int("seed", self.seed, 0)
        if self.max_accept is not None:
            _check_int("max_accept", self.max_accept, 1)
        if self.cache == "block" and self.cache_block_size < self.effective_block_size:
            raise ValueError(
                f"cache_block_size ({self.cache_block_size}) must be >= block_size "
                f"({self.block_size}) for the block-level cache"
            )
        if not isinstance(self.compile, bool) and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be True, False or one of {', '.join(COMPILE_MODES)}; got {self.compile!r}")
        if self.compile and self.cache != "cursor":
            raise ValueError(f"compile needs cache=\"cursor\" (the static-shape path), got cache={self.cache!r}")
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")

    @property
    def effective_block_size(self) -> int:
        """Predictions per forward: 1 for AR, block_size for MARS."""
        return 1 if self.mode == "ar" else self.block_size


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


class TauControl:
    """A thread-safe, mutable `tau` that decoders read before every forward.

    One control belongs to one generation: give each user's request its own, so that one
    user's slider never moves another user's threshold. `stop()` asks the decoder to finish
    after the current step (the tokens produced so far are kept).
    """

    def __init__(self, tau: float, metric: str = "probability"):
        self.metric = metric
        self._lock = threading.Lock()
        self._tau = check_tau(tau, metric)
        self._stopped = False

    @property
    def tau(self) -> float:
        with self._lock:
            return self._tau

    @tau.setter
    def tau(self, value: float) -> None:
        value = check_tau(value, self.metric)
        with self._lock:
            self._tau = value

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    @property
    def stopped(self) -> bool:
        with self._lock:
            return self._stopped

    def __repr__(self) -> str:
        return f"TauControl(tau={self.tau}, metric={self.metric!r})"
