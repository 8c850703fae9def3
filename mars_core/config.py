"""Decoding configuration and the live `tau` control.

`DecodeConfig` is frozen and validated once; `TauControl` is the one mutable knob, read by the
decoders before every forward so that a caller (a UI slider, a serving system under load) can
change the acceptance threshold in the middle of a generation.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from .lookup import LookupPolicy
from .tree import MAX_TREE_NODES, DraftTree

MODES = ("ar", "mars", "lossless", "spec")
EXACT_CACHES = ("none", "cursor")
DRAFT_GROUPS = ("all", "last", "ends")  # the caches that "lossless" and "spec" run on
MAX_DRAFT_TOKENS = 32  # K beyond this only widens the verify forward: acceptance decays geometrically
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

    mode:             "ar" (one token per forward), "mars" (a block of `block_size` predictions
                      per forward, accepted left to right while confident), "lossless" (the
                      model's own mask predictions are drafts that the next forward verifies:
                      exactly AR decoding's output; see `decode_exact`) or "spec" (a draft model
                      proposes `draft_tokens` tokens that the target verifies; a MARS target adds
                      tokens by the tau rule after the accepted drafts, the paper's section 4.6).
    tau:              acceptance threshold. probability / margin: accept while conf >= tau, in
                      [0, 1]; entropy: accept while H <= tau (nats), >= 0. The strictest setting
                      (tau = 1 for probability / margin, tau = 0 for entropy) accepts exactly one
                      token per step, i.e. it is AR decoding.
    block_size:       B, predictions per forward (ignored, i.e. 1, in "ar" mode).
    cache:            "none" (full recompute, the reference), "sliding" (KV cache of the
                      committed prefix), "block" (the paper's block-level cache for batches),
                      "cursor" (per-sequence write cursors, no block synchronisation; see
                      `decode_cursor`). None (the default): "sliding" for "ar" / "mars",
                      "cursor" for "lossless" / "spec".
    cache_block_size: B_cache for cache="block"; must be >= block_size.
    metric:           "probability", "entropy" or "margin".
    temperature:      0 is greedy; > 0 samples (seeded per sequence by `seed`).
    max_new_tokens:   generated tokens per sequence, EOS excluded from the count's cap.
    max_accept:       optional cap on the tokens a sequence emits per forward, in every mode
                      (None: no cap beyond the mode's own, block_size for "mars"). In "lossless"
                      and "spec" it counts verified drafts too, and the output stays exact.
    repeat_guard:     for tau's acceptance ("mars"; the other modes ignore it, so a model's
                      recommended default composes with every mode): a mask's token equal to the
                      token before it in the block is not accepted, whatever its confidence (the
                      next forward's AR head decides that position). Masks trained on hard targets
                      confuse their target with their neighbour's; the guard keeps those repeats
                      out of the output for about 1% fewer tokens per forward (docs/smollm2.md,
                      "The repeat guard"). The first prediction is always taken, so tau = 1 is AR.
    compile:          False (eager), True, or a `torch.compile` mode (one of COMPILE_MODES):
                      the cursor cache's static-shape path (`decode_compiled`), compiled once
                      per batch-size bucket and attention window (the first step: per prefill
                      width). True picks "reduce-overhead" (CUDA graphs) on a
                      CUDA device and "default" elsewhere. Needs cache="cursor" and mode
                      "ar", "mars" or greedy "lossless" (every kind of draft: `decode_shaped`,
                      one graph per window size it uses).
    draft_tokens:     K, tokens the draft model proposes per step ("spec"), 1..MAX_DRAFT_TOKENS.
    draft_block_size: 1: the draft model decodes AR; > 1: it decodes with MARS (its mask
                      predictions kept while its top-1 probability passes `draft_tau`).
    draft_tau:        the draft's MARS threshold (probability metric, [0, 1]).
    draft_groups:     the mask groups a "lossless" / "spec" forward carries: "last" (one group,
                      after the last draft: new drafts or extra tokens only when every draft was
                      accepted), "all" (one after every possible accept count, the spec's layout)
                      or "ends" (after none and after all drafts accepted). "last" is the fastest
                      on the bundled model (docs/lossless.md); the output of "lossless" never
                      depends on it.
    prompt_lookup:    0 (off) or n in 1..3, "lossless" only, greedy: where the text's last
                      n-gram (or a longer one) occurred before, the drafts are the tokens that
                      followed it instead of the mask predictions (`lookup.LookupPolicy`; with
                      draft_groups "last" a forward of copied drafts carries no mask group, so it
                      is B - 1 tokens narrower; with draft_budget the copied tokens join the
                      candidates); the output is still exactly AR's (docs/tree-drafts.md,
                      docs/cpu-kernels.md have the measurements).
    prompt_lookup_tokens: the most drafts such a lookup proposes, 1..MAX_DRAFT_TOKENS (None:
                      block_size - 1, as the masks; 7-10 measured best on a CPU, docs/cpu-kernels.md).
                      A step then emits up to this many + 1 tokens. Needs prompt_lookup.
    draft_tree:       None (a chain: the top-1 of each mask) or widths (k_1, .., k_D), D <= block_size
                      - 1, "lossless" only, greedy: the drafts are the top-k_d mask candidates
                      at distance d in every combination, verified in one forward with a group of
                      masks after every node (`draft_plan.tree_plan`; docs/tree-drafts.md). More tokens per
                      forward from the same weights, in a wider forward; the output is still AR's.
                      With prompt_lookup, a row whose text repeats drafts the lookup chain instead.
    draft_budget:     None or (nodes, groups), "lossless" only, greedy: each step verifies the `nodes`
                      candidate paths the masks' joint probabilities (and prompt lookup) make most
                      likely, with `groups` groups of masks after the nodes most likely to end the
                      accepted path (`draft_plan.budget_plan`): a forward of 1 + nodes + groups
                      (block_size - 1) positions. `fastest_exact` picks it from what a forward of each
                      width costs on the machine.

    "lossless" and "spec" run on cache="cursor" (fast) or cache="none" (the reference); tau is
    not used by "lossless" (its output never depends on it).
    """

    mode: str = "mars"
    tau: float = 0.95
    block_size: int = 4
    cache: str | None = None
    cache_block_size: int = 16
    metric: str = "probability"
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0
    max_accept: int | None = None
    repeat_guard: bool = False
    compile: bool | str = False
    draft_tokens: int = 4
    draft_block_size: int = 1
    draft_tau: float = 0.95
    draft_groups: str = "last"
    prompt_lookup: int = 0
    prompt_lookup_tokens: int | None = None
    draft_tree: tuple[int, ...] | None = None
    draft_budget: tuple[int, int] | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if self.cache is None:  # the default: the fast cache each mode runs on
            object.__setattr__(self, "cache", "cursor" if self.mode in ("lossless", "spec") else "sliding")
        if self.cache not in CACHES:
            raise ValueError(f"unknown cache mode {self.cache!r}; allowed: {', '.join(CACHES)}")
        check_tau(self.tau, self.metric)
        _check_int("block_size", self.block_size, 1)
        _check_int("cache_block_size", self.cache_block_size, 1)
        _check_int("max_new_tokens", self.max_new_tokens, 1)
        _check_int("seed", self.seed, 0)
        if self.max_accept is not None:
            _check_int("max_accept", self.max_accept, 1)
        if not isinstance(self.repeat_guard, bool):
            raise ValueError(f"repeat_guard must be True or False, got {self.repeat_guard!r}")
        if self.cache == "block" and self.cache_block_size < self.effective_block_size:
            raise ValueError(
                f"cache_block_size ({self.cache_block_size}) must be >= block_size "
                f"({self.block_size}) for the block-level cache"
            )
        if not isinstance(self.compile, bool) and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be True, False or one of {', '.join(COMPILE_MODES)}; got {self.compile!r}")
        if self.compile and self.cache != "cursor":
            raise ValueError(f"compile needs cache=\"cursor\" (the static-shape path), got cache={self.cache!r}")
        if self.compile and self.mode not in ("ar", "mars", "lossless"):
            raise ValueError(f"compile runs modes \"ar\", \"mars\" and \"lossless\"; mode={self.mode!r} runs "
                             "eagerly (compile=False)")
        if self.compile and self.mode == "lossless" and self.temperature != 0:
            raise ValueError(f"compiled lossless MARS is greedy (temperature 0); got temperature={self.temperature}: "
                             "use compile=False to sample")
        _check_int("draft_tokens", self.draft_tokens, 1)
        if self.draft_tokens > MAX_DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be <= {MAX_DRAFT_TOKENS}, got {self.draft_tokens}")
        _check_int("draft_block_size", self.draft_block_size, 1)
        check_tau(self.draft_tau, "probability")
        if self.draft_groups not in DRAFT_GROUPS:
            raise ValueError(f"unknown draft_groups {self.draft_groups!r}; allowed: {', '.join(DRAFT_GROUPS)}")
        if self.mode in ("lossless", "spec") and self.cache not in EXACT_CACHES:
            raise ValueError(
                f"mode={self.mode!r} runs on cache='cursor' (fast) or cache='none' (the reference), "
                f"got cache={self.cache!r}"
            )
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        _check_int("prompt_lookup", self.prompt_lookup, 0)
        if self.prompt_lookup and (self.mode != "lossless" or self.temperature != 0 or self.prompt_lookup > 3):
            raise ValueError("prompt_lookup (1..3: the shortest n-gram match that drafts) runs with mode=\"lossless\" "
                             f"and temperature 0; got prompt_lookup={self.prompt_lookup}, "
                             f"mode={self.mode!r}, temperature={self.temperature}")
        if self.prompt_lookup_tokens is not None:
            _check_int("prompt_lookup_tokens", self.prompt_lookup_tokens, 1)
            if not self.prompt_lookup or self.prompt_lookup_tokens > MAX_DRAFT_TOKENS:
                raise ValueError(f"prompt_lookup_tokens (1..{MAX_DRAFT_TOKENS}) needs prompt_lookup >= 1; got "
                                 f"prompt_lookup_tokens={self.prompt_lookup_tokens}, prompt_lookup={self.prompt_lookup}")
        if self.draft_tree is not None:
            self._check_tree()
        if self.draft_budget is not None:
            self._check_budget()

    def _check_tree(self) -> None:
        widths = self.draft_tree
        if isinstance(widths, (list, tuple)):
            widths = tuple(widths)
            object.__setattr__(self, "draft_tree", widths)
        if not isinstance(widths, tuple):
            raise ValueError(f"draft_tree must be a tuple of widths such as (2, 2, 1), got {widths!r}")
        if self.mode != "lossless" or self.temperature != 0:
            raise ValueError("draft_tree runs with mode=\"lossless\" and temperature 0; got "
                             f"mode={self.mode!r}, temperature={self.temperature}")
        tree = DraftTree(widths, self.block_size - 1)
        if tree.size > MAX_TREE_NODES:
            raise ValueError(f"draft_tree {widths} has {tree.size} nodes; at most {MAX_TREE_NODES} are allowed")

    def _check_budget(self) -> None:
        nodes_groups = self.draft_budget
        if isinstance(nodes_groups, list):
            nodes_groups = tuple(nodes_groups)
            object.__setattr__(self, "draft_budget", nodes_groups)
        if (not isinstance(nodes_groups, tuple) or len(nodes_groups) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in nodes_groups)):
            raise ValueError(f"draft_budget must be (nodes, groups), two integers such as (8, 2); got {nodes_groups!r}")
        nodes, groups = nodes_groups
        if not 1 <= nodes <= MAX_TREE_NODES or not 1 <= groups <= nodes + 1:
            raise ValueError(f"draft_budget needs 1 <= nodes <= {MAX_TREE_NODES} and 1 <= groups <= nodes + 1; "
                             f"got {nodes_groups}")
        if self.mode != "lossless" or self.temperature != 0 or self.draft_tree is not None or self.block_size < 2:
            raise ValueError("draft_budget runs with mode=\"lossless\", temperature 0, block_size >= 2 and no "
                             f"draft_tree; got mode={self.mode!r}, temperature={self.temperature}, "
                             f"block_size={self.block_size}, draft_tree={self.draft_tree}")

    @property
    def lookup_policy(self) -> LookupPolicy | None:
        """The prompt-lookup rule of this config (None without prompt_lookup): its drafts default
        to block_size - 1 tokens; masks after a copied chain only without the "last" layout."""
        if not self.prompt_lookup:
            return None
        tokens = self.block_size - 1 if self.prompt_lookup_tokens is None else self.prompt_lookup_tokens
        after = self.draft_groups != "last" or self.draft_tree is not None or self.draft_budget is not None
        return LookupPolicy(self.prompt_lookup, max(tokens, 1), after)

    @property
    def effective_block_size(self) -> int:
        """Predictions per forward: 1 for AR, block_size for MARS."""
        return 1 if self.mode == "ar" else self.block_size

    @property
    def lookahead(self) -> int:
        """Positions past the committed text that one forward may use (the context check)."""
        if self.mode == "lossless" and self.temperature == 0:  # the widest window of the exact step
            from .draft_plan import lookahead
            return lookahead(self)
        if self.mode == "lossless":  # the bonus token, B - 1 drafts, then a group of B - 1 masks
            return 1 + 2 * (self.block_size - 1)
        if self.mode == "spec":
            return self.draft_tokens + max(self.block_size, self.draft_block_size)
        return self.effective_block_size


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
