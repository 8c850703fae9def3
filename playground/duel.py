"""AR and MARS on the same prompt, stepped alternately as if both ran at once.

Each side is a `mars_core.stream` iterator; the duel always advances the side whose own decode
time is smaller, so on one device the two sides progress as they would side by side.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from mars_core import DecodeConfig, TauControl, stream

from . import exactness, render
from .models import Loaded, guards_repeats

AR_SIDES = ("AR baseline checkpoint", "MARS model at 1 token/step")
# what the MARS side runs: value -> label (lossless and spec are exact; see mars_core.decode_exact)
MARS_MODES = {"mars": "MARS (tau)",
              "fastest": "exact, fastest here (lossless MARS with the drafts fastest_exact picked for this machine)",
              "lossless": "lossless MARS (exact: verifies its own drafts)",
              "lookup": "lossless MARS + prompt lookup (exact: copies drafts where the text repeats)",
              "tree": "lossless MARS + draft tree (exact: the masks' top 2 guesses)",
              "spec": "spec: the AR checkpoint drafts, MARS verifies (exact at tau = 1)"}
# "lookup" is lossless MARS drafting up to this many tokens copied from after an earlier occurrence of
# the text's last 2-gram (the library's prompt_lookup=2; 10 measured best on a CPU, docs/cpu-kernels.md)
LOOKUP_TOKENS = 10
# "tree" drafts the masks' top 2 / 2 / 1 candidates at distance 1 / 2 / 3 (the library's draft_tree; 1.64 tokens
# per forward against 1.42 for the top-1 chain on the real pair, held-out self-instruct, docs/tree-drafts.md)
TREE = (2, 2, 1)
EXACT_MODES = ("lossless", "spec", "ar")  # the decoder modes whose greedy output is the model's AR output
# "fastest" takes these fields from `mars_core.fastest_exact`'s config (playground.fastest)
FASTEST_FIELDS = ("block_size", "draft_groups", "prompt_lookup", "prompt_lookup_tokens", "draft_tree", "draft_budget")


@dataclass
class Step:
    """One forward as the replay shows it: where it started in the output, all B predictions with
    their confidences, how many were committed, the tau it used, and whether the side stopped."""

    start: int  # output tokens before this forward
    proposed: list[int]
    confidences: list[float]
    accepted: int
    tau: float
    finished: bool
    verified: int | None = None  # exact modes: how many of `proposed` are verified drafts


class Side:
    """One decoder of the duel and what it has produced so far."""

    def __init__(self, name: str, loaded: Loaded, prompt: str, cfg: DecodeConfig, control: TauControl,
                 draft: Loaded | None = None):
        self.name = name
        self.loaded = loaded
        self.cfg = cfg
        self.it = stream(loaded.model, loaded.tokenizer, prompt, cfg, control,
                         draft_model=draft.model if draft is not None else None)
        self.control = control
        self.track = render.TokenTrack(loaded.tokenizer, cfg.effective_block_size)
        self.own = 0.0  # seconds spent in this side's own steps (compute time)
        self.elapsed = 0.0  # wall seconds from the start of the duel to this side's latest step
        self.forwards = 0
        self.tokens = 0
        self.started = False
        self.done = False
        self.note = ""
        self.steps: list[Step] = []  # every forward, for the replay

    def step(self) -> None:
        t = time.perf_counter()
        try:
            ev = next(self.it)
        except StopIteration:
            ev = None
        self.own += time.perf_counter() - t
        self.started = True
        if ev is None:
            self.done = True
            return
        verified = ev.verified[0] if ev.verified is not None else None
        self.steps.append(Step(len(self.track.ids), ev.proposed[0], ev.proposed_confidences[0],
                               len(ev.tokens[0]), ev.tau, ev.finished[0], verified))
        self.track.add(ev.step, ev.tokens[0], ev.confidences[0], ev.tau, verified or 0)
        self.forwards, self.tokens = ev.forwards, ev.generated
        if ev.finished[0]:
            self.done = True
            for _ in self.it:  # let the generator finish cleanly
                pass

    @property
    def stats(self) -> dict:
        return render.counters(self.forwards, self.tokens, self.own, self.elapsed)

    def clock(self, slow: float) -> float:
        """This side's time as if it ran alone: its compute plus `slow` seconds per forward."""
        return self.own + slow * self.forwards

    @property
    def status(self) -> str:
        """waiting, running, stopped (by the user or the time limit), limit (max new tokens) or done (EOS)."""
        if self.control.stopped:
            return "stopped"
        if not self.done:
            return "running" if self.started else "waiting"
        return "limit" if self.tokens >= self.cfg.max_new_tokens else "done"


class Duel:
    """Set up both sides; `run()` steps them and yields after every step once both started."""

    def __init__(self, prompt: str, settings: dict, ar_side: str, mars_model: Loaded, ar_model: Loaded | None,
                 max_seconds: float, mars_mode: str = "mars", same_vocab: bool = True,
                 fastest: DecodeConfig | None = None, fallback_note: str = ""):
        """`fastest`: the "fastest" mode's configuration for this MARS model (None while it is being
        measured: the mode then runs lossless + prompt lookup and `fallback_note` says so)."""
        if ar_side not in AR_SIDES:
            raise ValueError(f"ar_side must be one of {', '.join(AR_SIDES)}, got {ar_side!r}")
        if mars_mode not in MARS_MODES:
            raise ValueError(f"mars_mode must be one of {', '.join(MARS_MODES)}, got {mars_mode!r}")
        draft = None
        if mars_mode == "spec":
            if ar_model is None or not same_vocab:
                raise ValueError("spec needs a draft model: load an AR baseline checkpoint with the MARS model's "
                                 "tokenizer (Models tab), or pick another MARS mode")
            draft = ar_model
        note = ""
        if ar_side == AR_SIDES[0] and ar_model is None:
            note = "no AR baseline checkpoint loaded: the AR side runs the MARS model at 1 token/step"
        if ar_side == AR_SIDES[1] or ar_model is None:
            ar_model = mars_model
        mars_settings = dict(settings)
        if mars_mode == "mars" and guards_repeats(mars_model):
            mars_settings["repeat_guard"] = True
        if mars_mode != "mars" and settings["cache"] not in ("none", "cursor"):
            mars_settings["cache"] = "cursor"  # the exact modes run on the cursor cache (or none)
        if mars_mode == "fastest" and settings.get("temperature", 0) != 0:
            raise ValueError("\"exact, fastest here\" decodes greedily: set temperature to 0, or pick \"lossless "
                             "MARS\", which also samples")
        if mars_mode == "lookup" or (mars_mode == "fastest" and fastest is None):
            if settings.get("temperature", 0) != 0:
                raise ValueError("prompt lookup drafts greedily: set temperature to 0 for \"lossless MARS + prompt "
                                 "lookup\", or pick \"lossless MARS\", which also samples")
            mars_settings.update(prompt_lookup=2, prompt_lookup_tokens=LOOKUP_TOKENS)
        if mars_mode == "fastest" and fastest is not None:
            mars_settings.update({k: getattr(fastest, k) for k in FASTEST_FIELDS})
        if mars_mode == "tree":
            if settings.get("temperature", 0) != 0 or settings["block_size"] < 2:
                raise ValueError("the draft tree drafts greedily from the masks: set temperature to 0 and block size "
                                 "B >= 2 for \"lossless MARS + draft tree\", or pick \"lossless MARS\"")
            mars_settings.update(draft_tree=TREE[: settings["block_size"] - 1])
        mode = "lossless" if mars_mode in ("lookup", "tree", "fastest") else mars_mode
        if mars_mode == "fastest" and fastest is not None:
            mode = fastest.mode  # "ar" where no draft shape pays for its positions on this machine
        mars_cfg = DecodeConfig(mode=mode, **mars_settings)
        self.mars_mode = mars_mode
        ar_cfg = DecodeConfig(mode="ar", **dict(settings, cache="sliding" if settings["cache"] == "block"
                                                else settings["cache"]))
        self.mars = Side("mars", mars_model, prompt, mars_cfg, TauControl(mars_cfg.tau, mars_cfg.metric), draft)
        self.ar = Side("ar", ar_model, prompt, ar_cfg, TauControl(ar_cfg.tau, ar_cfg.metric))
        self.ar.note = note
        self.mars.note = fallback_note if mars_mode == "fastest" and fastest is None else ""
        self.prompt = prompt
        self._tie = None  # (token, top-2 gap) where a reduced-precision exact run parted from AR
        self.max_seconds = max_seconds
        self.timed_out = False

    @property
    def sides(self) -> tuple[Side, Side]:
        return self.ar, self.mars

    def stop(self) -> None:
        self.mars.control.stop()
        self.ar.control.stop()

    def run(self, slow: float = 0.0):
        """Step until both finish; yields self after every step once both sides have started.

        `slow` (seconds per forward, the slow-motion control) is added to each side's clock alike
        and slept so that the page shows both sides on one timeline; it never enters the
        compute time that tokens/s is computed from."""
        t0 = time.perf_counter()
        deadline = t0 + self.max_seconds
        ar, mars = self.sides
        while not (ar.done and mars.done):
            side = min((s for s in (ar, mars) if not s.done), key=lambda s: (s.clock(slow), s.name != "ar"))
            side.step()
            if slow:  # show the step when it would have finished on its own timeline
                wait = t0 + side.clock(slow) - time.perf_counter()
                if wait > 0:
                    time.sleep(min(wait, max(deadline - time.perf_counter(), 0.0)))
            side.elapsed = time.perf_counter() - t0
            if time.perf_counter() > deadline and not self.timed_out:
                self.timed_out = True
                self.stop()
            if ar.started and mars.started:
                yield self

    def agree(self) -> bool:
        return self.ar.track.text == self.mars.track.text

    def proves(self) -> bool:
        """Does the MARS side's mode make its output the AR side's greedy decoding of the same model?
        Lossless (and spec at the strictest tau) is greedy AR of the same model, and so is AR itself
        ("exact, fastest here" where no draft pays): so only when the AR side runs the MARS model
        itself (or the base of a mask-gated one, whose AR decoding it is: `exactness.same_ar_path`),
        greedily, and the MARS side's tau never loosened."""
        cfg = self.mars.cfg
        strict = cfg.mode in ("lossless", "ar") or (cfg.mode == "spec" and all(
            s.tau == (0.0 if cfg.metric == "entropy" else 1.0) for s in self.mars.steps))
        return (cfg.mode in EXACT_MODES and strict and cfg.temperature == 0
                and exactness.same_ar_path(self.mars.loaded, self.ar.loaded) and not self.mars.control.stopped)

    def guaranteed(self) -> bool:
        """Token for token identical to AR, by construction: `proves`, in float32 (playground.exactness)."""
        return self.proves() and exactness.strict(self.mars.loaded)

    @property
    def reduced(self) -> str:
        """The reduced precision (e.g. "bfloat16") an otherwise proven agreement runs in, else ""."""
        return exactness.precision(self.mars.loaded) if self.proves() and not self.guaranteed() else ""

    def why_not_guaranteed(self) -> str:
        """For an exact MARS mode whose guarantee does not cover this comparison: why, in words."""
        cfg = self.mars.cfg
        if cfg.mode not in EXACT_MODES or self.guaranteed():
            return ""
        if self.reduced:
            if self.agree():
                return ""  # the agreement line itself says what reduced precision guarantees
            if self._tie is None:  # one forward, once
                self._tie = exactness.tie_gap(self.mars.loaded, self.prompt, self.ar.track.ids, self.mars.track.ids)
            return exactness.differ_note(self.reduced, self._tie)
        if cfg.temperature != 0:
            return "Exact modes match AR only when both decode greedily (temperature 0)."
        if self.mars.control.stopped:
            return "The MARS side was stopped early, so its output is shorter than AR's."
        if not exactness.same_ar_path(self.mars.loaded, self.ar.loaded):
            return (f"The exact modes reproduce {self.mars.loaded.name}'s own AR decoding, not the separate AR "
                    f"checkpoint on the left: set \"AR side runs\" to \"{AR_SIDES[1]}\" to compare against it.")
        return "tau went below 1 during the run, so spec decoding accepted MARS tokens it did not verify."

    def summary(self) -> dict:
        """The API's view: per side model, text, ids, accepted per step and stats; agreement, speed-up."""
        def side(s: Side) -> dict:
            return {"model": s.loaded.name, "text": s.track.text, "token_ids": s.track.ids,
                    "accepted_per_step": s.track.accepted, "stats": dict(s.stats, stopped=s.control.stopped)}

        out = {"ar": side(self.ar), "mars": side(self.mars), "timed_out": self.timed_out}
        out["agree"] = self.agree()
        out["guaranteed"] = self.guaranteed()
        # what the exact modes promise here: "identical" (float32), "argmax" (each token the model's own argmax
        # in the forward that verified it: reduced precision, playground.exactness), or None
        out["guarantee"] = "identical" if out["guaranteed"] else "argmax" if self.reduced else None
        out["precision"] = exactness.precision(self.mars.loaded)
        out["why"] = self.why_not_guaranteed() or None
        out["first_difference"] = render.first_difference(self.ar.track.text, self.mars.track.text)
        ar_tps = out["ar"]["stats"]["tokens_per_second"]
        out["speedup"] = out["mars"]["stats"]["tokens_per_second"] / ar_tps if ar_tps else 0.0
        return out
