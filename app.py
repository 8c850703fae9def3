"""MARS Playground: AR and MARS side by side, live tau, the speed-quality frontier, batches and
the KV cache, and how the training mask and the sliding window work.

    python app.py                      # the bundled models (assets/models/tiny-mars-b4 + tiny-ar-sft)
    python app.py MODEL_FOLDER_OR_HUB_ID
    MARS_MODEL=... AR_MODEL=... python app.py   # AR_MODEL="" runs the AR side on the MARS model

All decoding goes through `mars_core`; this file only wires it to Gradio. `build_app(...)` returns
the Blocks (tests pass tiny models); `main()` launches it.
"""
import time

_T0 = time.perf_counter()  # noqa: E402 - start-to-ready is measured from here

import functools  # noqa: E402
import inspect  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback
from dataclasses import dataclass, replace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gradio as gr  # noqa: E402

from mars_core import DecodeConfig, TauControl, generate, stream  # noqa: E402
from playground import plots, render  # noqa: E402
from playground.models import (BUNDLED_AR, BUNDLED_MARS, QUANTIZATIONS, RELEASED_AR, RELEASED_MARS,  # noqa: E402
                               Loaded, ModelStore, display_name, scrub)

try:  # ZeroGPU on Hugging Face Spaces; a no-op everywhere else
    import spaces

    GPU = spaces.GPU
except ImportError:
    def GPU(fn=None, **_kwargs):
        return fn if fn is not None else (lambda f: f)

from mars_core.config import CACHES, METRICS  # noqa: E402  (one source of truth)
from mars_core.lists import parse_list  # noqa: E402
AR_SIDES = ("AR baseline checkpoint", "MARS model at 1 token/step")
PRESETS = ("bundled", "released (hub)", "custom")
MAX_PROMPT_CHARS = 20000
TAU_MAX = {"probability": 1.0, "margin": 1.0, "entropy": 4.0}


@dataclass
class AppOptions:
    """Limits and knobs of one app instance (tests shrink them)."""

    max_new_tokens_cap: int = 512
    default_max_new_tokens: int = 128
    max_block_size: int = 16
    max_seconds: float = 120.0  # per generation / batch / sweep; then it stops with a notice
    step_delay: float = 0.0  # seconds slept after every displayed step (tests: time to move a slider)
    render_interval: float = 0.08  # seconds between UI updates while streaming
    concurrency_limit: int = 2  # decodes running at once (all tabs share it)
    max_queue: int = 16
    frontier_max_n: int = 64
    batch_max: int = 16
    model_capacity: int = 2  # non-bundled models kept loaded
    device: str | None = None


class Session:
    """Per-browser-session state, kept in a gr.State (one instance per session): the live tau
    controls of the running generation and the model choice. Never shared between sessions."""

    def __init__(self):
        self.mars_control: TauControl | None = None
        self.ar_control: TauControl | None = None
        self.mars_source: str | None = None  # None: the app's defaults
        self.ar_source: str | None = None
        self.quantization = "none"
        self.last_accepted: list[int] = []
        self.last_block = 4

    def __deepcopy__(self, memo):  # gr.State deep-copies values; a session is one object
        return self


def _fail(e: Exception, sources=()):
    raise gr.Error(scrub(str(e), sources), print_exception=False) from None


def guard(fn):
    """Turn ValueErrors into a UI / API error message, anything unexpected into a short one
    (the traceback goes to the server log, never to the user)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except ValueError as e:
                _fail(e)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                raise gr.Error(f"internal error ({type(e).__name__})", print_exception=False) from None
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ValueError as e:
            _fail(e)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            raise gr.Error(f"internal error ({type(e).__name__})", print_exception=False) from None
    return call


def as_int(name: str, value, lo: int, hi: int) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if not f.is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= f <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {int(f)}")
    return int(f)


def as_float(name: str, value, lo: float, hi: float) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not (lo <= f <= hi):  # also rejects nan
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}, got {value!r}")
    return f


class _Side:
    def __init__(self, name, loaded: Loaded, iterator, control: TauControl, block: int):
        self.name = name
        self.loaded = loaded
        self.it = iterator
        self.control = control
        self.track = render.TokenTrack(loaded.tokenizer, block)
        self.own = 0.0  # seconds spent in this side's own steps
        self.forwards = 0
        self.tokens = 0
        self.started = False
        self.done = False
        self.note = ""

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
        self.track.add(ev.step, ev.tokens[0], ev.confidences[0], ev.tau)
        self.forwards, self.tokens = ev.forwards, ev.generated
        if ev.finished[0]:
            self.done = True
            for _ in self.it:  # let the generator finish cleanly
                pass

    @property
    def stats(self) -> dict:
        return render.counters(self.forwards, self.tokens, self.own)

    @property
    def status(self) -> str:
        if not self.done:
            return "running" if self.started else "waiting"
        return "stopped" if self.control.stopped else "done"


class Playground:
    """The app's handlers; each is a plain method, so tests call them directly."""

    def __init__(self, mars_source: str, ar_source: str | None, options: AppOptions | None = None,
                 store: ModelStore | None = None, quantization: str = "none"):
        self.opts = options or AppOptions()
        self.store = store or ModelStore(self.opts.model_capacity, self.opts.device)
        self.mars_source = mars_source
        self.ar_source = ar_source or None
        self.quantization = quantization
        self.mars = self.store.get(mars_source, quantization, pin=True)
        self.ar = self.store.get(ar_source, quantization, pin=True) if ar_source else None
        self.default_block = self.mars.trained_block_size or 4
        self._vocab_same: dict[tuple[int, int], bool] = {}

    # ---- models -----------------------------------------------------------------------------
    def models_for(self, session: Session | None) -> tuple[Loaded, Loaded | None]:
        if session is None or session.mars_source is None:
            return self.mars, self.ar
        q = session.quantization
        mars = self.store.get(session.mars_source, q)
        ar = self.store.get(session.ar_source, q) if session.ar_source else None
        return mars, ar

    def _same_vocab(self, a: Loaded, b: Loaded) -> bool:
        key = (id(a.tokenizer), id(b.tokenizer))
        if key not in self._vocab_same:
            self._vocab_same[key] = a.tokenizer is b.tokenizer or a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
        return self._vocab_same[key]

    # ---- validation -------------------------------------------------------------------------
    def check(self, prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache):
        """Validated decode settings, or a ValueError that says what is wrong."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("The prompt is empty: type a question or pick an example.")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"The prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}.")
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
        tau = as_float("tau", tau, 0.0, TAU_MAX[metric] if metric == "entropy" else 1.0)
        block_size = as_int("block size", block_size, 1, self.opts.max_block_size)
        temperature = as_float("temperature", temperature, 0.0, 2.0)
        seed = as_int("seed", seed, 0, 2**31 - 1)
        max_new_tokens = as_int("max new tokens", max_new_tokens, 1, self.opts.max_new_tokens_cap)
        return dict(tau=tau, block_size=block_size, metric=metric, temperature=temperature, seed=seed,
                    max_new_tokens=max_new_tokens, cache=cache)

    # ---- AR vs MARS -------------------------------------------------------------------------
    def _pair(self, prompt, settings: dict, ar_side: str, session: Session, delay: float):
        """Step AR and MARS alternately, always advancing the side whose own decode time is
        smaller (as if both ran at once); yields (ar, mars, timed_out) after every step."""
        if ar_side not in AR_SIDES:
            raise ValueError(f"ar_side must be one of {AR_SIDES}, got {ar_side!r}")
        mars_model, ar_model = self.models_for(session)
        note = ""
        if ar_side == AR_SIDES[0] and ar_model is None:
            note = "no AR baseline checkpoint loaded: the AR side runs the MARS model at 1 token/step"
        if ar_side == AR_SIDES[1] or ar_model is None:
            ar_model = mars_model
        mars_cfg = DecodeConfig(mode="mars", **settings)
        ar_cfg = DecodeConfig(mode="ar", **dict(settings, cache="sliding" if settings["cache"] == "block"
                                                else settings["cache"]))
        mars_ctl = TauControl(mars_cfg.tau, mars_cfg.metric)
        ar_ctl = TauControl(ar_cfg.tau, ar_cfg.metric)
        session.mars_control, session.ar_control = mars_ctl, ar_ctl
        ar = _Side("ar", ar_model, stream(ar_model.model, ar_model.tokenizer, prompt, ar_cfg, ar_ctl), ar_ctl, 1)
        mars = _Side("mars", mars_model, stream(mars_model.model, mars_model.tokenizer, prompt, mars_cfg, mars_ctl),
                     mars_ctl, mars_cfg.block_size)
        ar.note = note
        deadline = time.perf_counter() + self.opts.max_seconds
        timed_out = False
        try:
            while not (ar.done and mars.done):
                side = min((s for s in (ar, mars) if not s.done), key=lambda s: (s.own, s.name != "ar"))
                side.step()
                if time.perf_counter() > deadline and not timed_out:
                    timed_out = True
                    mars_ctl.stop()
                    ar_ctl.stop()
                if ar.started and mars.started:
                    yield ar, mars, timed_out
                    if delay and not side.done:
                        time.sleep(delay)
        finally:
            session.last_accepted = list(mars.track.accepted)
            session.last_block = mars_cfg.block_size
            if session.mars_control is mars_ctl:
                session.mars_control = session.ar_control = None

    def _render(self, ar: _Side, mars: _Side, metric: str, timed_out: bool, final: bool, with_gauge: bool):
        note = f"stopped after the {self.opts.max_seconds:g} s limit" if timed_out else ""
        ar_html = render.panel_html("ar", "AR", ar.loaded.name + (" (1 token/step)" if ar.loaded is mars.loaded else ""),
                                    ar.track, ar.stats, ar.status, " · ".join(x for x in (ar.note, note) if x))
        mars_html = render.panel_html("mars", f"MARS (B = {mars.track.block})", mars.loaded.name, mars.track,
                                      mars.stats, mars.status, note)
        steps = render.steps_chart_html(mars.track.accepted, mars.track.taus, mars.track.block, TAU_MAX[metric])
        gauge = plots.gauge(mars.stats["tokens_per_second"], ar.stats["tokens_per_second"]) if with_gauge else gr.skip()
        if final:
            same = self._same_vocab(ar.loaded, mars.loaded)
            cmp = render.compare_html(ar.track.text, mars.track.text, ar.track.ids if same else None,
                                      mars.track.ids if same else None)
        else:
            cmp = '<div class="compare muted">comparing when both finish…</div>'
        return ar_html, mars_html, gauge, steps, cmp

    @GPU
    def ui_generate(self, prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache, ar_side,
                    session: Session):
        """Stream both panels; yields (ar_html, mars_html, gauge, steps_chart, compare)."""
        settings = self.check(prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache)
        last, last_gauge = 0.0, 0.0
        ar = mars = None
        timed_out = False
        for ar, mars, timed_out in self._pair(prompt, settings, ar_side, session, self.opts.step_delay):
            now = time.perf_counter()
            if now - last >= self.opts.render_interval:
                with_gauge = now - last_gauge >= 0.5
                yield self._render(ar, mars, metric, timed_out, False, with_gauge)
                last = now
                if with_gauge:
                    last_gauge = now
        if timed_out:
            gr.Warning(f"The generation was stopped after the {self.opts.max_seconds:g} s limit.")
        yield self._render(ar, mars, metric, timed_out, True, True)

    def api_generate(self, prompt: str, tau: float = 0.95, block_size: int = 4, metric: str = "probability",
                     temperature: float = 0.0, seed: int = 0, max_new_tokens: int = 128, cache: str = "sliding",
                     ar_side: str = AR_SIDES[0]) -> dict:
        """Decode `prompt` with AR and MARS. Returns per side: model name, text, token ids,
        accepted tokens per forward and stats; and whether the outputs agree."""
        settings = self.check(prompt, tau, block_size, metric, temperature, seed, max_new_tokens, cache)
        ar = mars = None
        timed_out = False
        for ar, mars, timed_out in self._pair(prompt, settings, ar_side, Session(), 0.0):
            pass

        def side(s: _Side) -> dict:
            return {"model": s.loaded.name, "text": s.track.text, "token_ids": s.track.ids,
                    "accepted_per_step": s.track.accepted, "stats": dict(s.stats, stopped=s.control.stopped)}

        out = {"ar": side(ar), "mars": side(mars), "timed_out": timed_out}
        out["agree"] = ar.track.text == mars.track.text
        out["first_difference"] = render.first_difference(ar.track.text, mars.track.text)
        ar_tps = out["ar"]["stats"]["tokens_per_second"]
        out["speedup"] = out["mars"]["stats"]["tokens_per_second"] / ar_tps if ar_tps else 0.0
        return out

    def set_tau(self, tau, metric, session: Session) -> None:
        """Live tau: the running MARS generation of this session uses it from its next forward."""
        ctl = session.mars_control if session is not None else None
        if ctl is None or ctl.metric != metric:
            return
        try:
            ctl.tau = tau
        except ValueError:
            pass  # out of range for this metric: keep the current value

    def stop(self, session: Session) -> None:
        for ctl in (session.mars_control, session.ar_control):
            if ctl is not None:
                ctl.stop()

    def metric_changed(self, metric):
        if metric == "entropy":
            return gr.update(minimum=0.0, maximum=TAU_MAX["entropy"], value=0.3, step=0.05,
                             label="tau (entropy, nats: accept while H <= tau; 0 = AR)")
        return gr.update(minimum=0.0, maximum=1.0, value=0.95, step=0.01,
                         label=f"tau ({metric}: accept while confidence >= tau; 1 = AR)")

    # ---- frontier ---------------------------------------------------------------------------
    def frontier_initial(self, session: Session | None = None):
        mars, _ = self.models_for(session)
        data = mars.eval_json()
        if data is None:
            return plots.frontier(None), f"**{mars.name}** has no precomputed sweep (no `eval.json` in its folder)."
        from training.evaluate import summary_table
        return plots.frontier(data), (f"Precomputed sweep from the model card of **{mars.name}** "
                                      f"({data.get('n', '?')} held-out problems).\n\n" + summary_table(data))

    @GPU
    def frontier_run(self, n, taus, block_size, max_new_tokens, session: Session, progress=gr.Progress()):
        from training.evaluate import DEFAULT_TAUS, run_one, summary_table
        from tasks.synthetic import make_examples

        n = as_int("problems", n, 1, self.opts.frontier_max_n)
        block_size = as_int("block size", block_size, 1, self.opts.max_block_size)
        max_new_tokens = as_int("max new tokens", max_new_tokens, 1, self.opts.max_new_tokens_cap)
        tau_list = list(parse_list(taus, float, allow_empty=True, name="taus")) or list(DEFAULT_TAUS)
        if len(tau_list) > 12:
            raise ValueError("at most 12 tau values per sweep")
        for t in tau_list:
            as_float("tau", t, 0.0, 1.0)
        mars, ar = self.models_for(session)
        examples = make_examples(n, 0, "eval")
        base = DecodeConfig(max_new_tokens=max_new_tokens, cache="sliding")
        jobs = []
        if ar is not None:
            jobs.append(("ar-baseline", ar, replace(base, mode="ar")))
        jobs.append(("mars", mars, replace(base, mode="ar")))
        jobs += [("mars", mars, replace(base, mode="mars", tau=t, block_size=block_size)) for t in tau_list]
        runs, own_ar = [], None
        deadline = time.perf_counter() + self.opts.max_seconds
        progress((0, len(jobs)), desc="sweep", unit="runs")
        for i, (label, loaded, cfg) in enumerate(jobs):
            if time.perf_counter() > deadline:
                gr.Warning(f"Sweep stopped after the {self.opts.max_seconds:g} s limit ({i} of {len(jobs)} runs).")
                break
            progress((i, len(jobs)), desc=f"{label} {cfg.mode}" + (f" tau={cfg.tau}" if cfg.mode == "mars" else ""),
                     unit="runs")
            r = run_one(loaded.model, loaded.tokenizer, examples, cfg, batch_size=8)
            if label == "mars" and cfg.mode == "ar":
                own_ar = r["_ids"]
            elif own_ar is not None and cfg.mode == "mars":
                r["matches_ar"] = sum(a == b for a, b in zip(r["_ids"], own_ar)) / len(examples)
            runs.append({k: v for k, v in dict(r, model=label).items() if not k.startswith("_")})
        progress((len(jobs), len(jobs)), desc="done", unit="runs")
        result = {"n": n, "seed": 0, "split": "eval", "runs": runs}
        return plots.frontier(result), f"Sweep on {n} held-out problems, {max_new_tokens} new tokens max.\n\n" + \
            summary_table(result)

    # ---- batch & KV cache -------------------------------------------------------------------
    @GPU
    def batch_run(self, batch_size, cache, cache_block_size, tau, block_size, max_new_tokens, session: Session):
        from tasks.synthetic import make_examples

        batch_size = as_int("batch size", batch_size, 1, self.opts.batch_max)
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
        block_size = as_int("block size", block_size, 1, self.opts.max_block_size)
        cache_block_size = as_int("cache block size", cache_block_size, block_size, 256)
        tau = as_float("tau", tau, 0.0, 1.0)
        max_new_tokens = as_int("max new tokens", max_new_tokens, 1, self.opts.max_new_tokens_cap)
        mars, ar = self.models_for(session)
        ar = ar or mars
        prompts = [ex["messages"][0]["content"] for ex in make_examples(batch_size, 1, "eval")]
        ar_cfg = DecodeConfig(mode="ar", cache="sliding", max_new_tokens=max_new_tokens)
        mars_cfg = DecodeConfig(mode="mars", tau=tau, block_size=block_size, cache=cache,
                                cache_block_size=cache_block_size, max_new_tokens=max_new_tokens)
        results = {}
        for label, loaded, cfg in (("AR (KV cache)", ar, ar_cfg), (f"MARS (cache: {cache})", mars, mars_cfg)):
            ctl = TauControl(cfg.tau, cfg.metric)
            timer = threading.Timer(self.opts.max_seconds / 2, ctl.stop)
            timer.start()
            try:
                results[label] = (loaded, generate(loaded.model, loaded.tokenizer, prompts, cfg, ctl), ctl)
            finally:
                timer.cancel()
        rows = ["| run | model | wall (s) | tokens | forwards | tokens/forward | tokens/s | idle slots |",
                "|---|---|---|---|---|---|---|---|"]
        tps = {}
        for label, (loaded, res, ctl) in results.items():
            s = res.stats
            idle = _idle_slots(s.accepted_per_step)
            tps[label] = s.tokens_per_second
            rows.append(f"| {label} | {loaded.name} | {s.seconds:.2f} | {s.tokens} | {s.forwards} | "
                        f"{s.tokens_per_forward:.2f} | {s.tokens_per_second:.1f} | {idle} |"
                        + (" stopped (time limit)" if ctl.stopped else ""))
        ar_tps, mars_tps = list(tps.values())
        speed = mars_tps / ar_tps if ar_tps else 0.0
        summary = (f"Batch of {batch_size} held-out problems. **Speed-up of MARS over AR: {speed:.2f}x** "
                   f"(tokens/s; wall-clock includes the prompt prefill).\n\n" + "\n".join(rows) +
                   "\n\nIdle slots: forwards in which a sample waited for the others to fill the cache block.")
        mars_res = list(results.values())[1][1]
        fig = plots.timeline(mars_res.stats.accepted_per_step, f"MARS tokens accepted per sample and forward, "
                             f"cache = {cache}" + (f", B_cache = {cache_block_size}" if cache == "block" else ""))
        return summary, fig

    # ---- how it works -----------------------------------------------------------------------
    def mask_plot(self, n, block_size):
        n = as_int("n", n, 1, 64)
        block_size = as_int("B", block_size, 1, 32)
        return plots.mask_figure(n, block_size)

    def window_plot(self, session: Session):
        return plots.window_figure(session.last_accepted if session else [], session.last_block if session else 4)

    # ---- model picker -----------------------------------------------------------------------
    def load_models(self, preset, mars_text, ar_text, quantization, session: Session):
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}")
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}")
        if preset == PRESETS[0]:
            mars_src, ar_src = self.mars_source, self.ar_source
        elif preset == PRESETS[1]:
            mars_src, ar_src = RELEASED_MARS, RELEASED_AR
        else:
            mars_src = (mars_text or "").strip()
            ar_src = (ar_text or "").strip() or None
            if not mars_src:
                raise ValueError("give the MARS model: a local folder or a hub id (owner/name)")
        mars = self.store.get(mars_src, quantization, pin=preset == PRESETS[0] and quantization == self.quantization)
        ar = self.store.get(ar_src, quantization) if ar_src else None
        session.mars_source, session.ar_source, session.quantization = mars_src, ar_src, quantization
        fig, note = self.frontier_initial(session)
        return self.model_status(session), fig, note, gr.update(value=mars.trained_block_size or self.default_block)

    def model_status(self, session: Session | None = None) -> str:
        mars, ar = self.models_for(session)
        q = mars.quantization
        dev = str(next(mars.model.parameters()).device)
        return (f"**MARS model:** `{mars.name}` · **AR baseline:** `{ar.name if ar else '(none: MARS at 1 token/step)'}`"
                f" · quantization: {q} · device: {dev}")


def _idle_slots(accepted_per_step: list[list[int]]) -> int:
    """Forwards in which a sample that had not finished accepted nothing (waited at a block boundary)."""
    if not accepted_per_step:
        return 0
    idle = 0
    for i in range(len(accepted_per_step[0])):
        col = [step[i] for step in accepted_per_step]
        last = max((k for k, v in enumerate(col) if v > 0), default=-1)
        idle += sum(1 for v in col[:last] if v == 0)
    return idle


def _examples() -> list[list[str]]:
    from tasks.synthetic import make_examples

    picked, seen = [], {}
    for ex in make_examples(30, 0, "eval"):
        if seen.get(ex["family"], 0) < 2:
            seen[ex["family"]] = seen.get(ex["family"], 0) + 1
            picked.append((ex["family"], ex["messages"][0]["content"]))
    order = {"arithmetic": 0, "units": 1, "lists": 2}
    return [[q] for _, q in sorted(picked, key=lambda x: order.get(x[0], 9))]


INTRO = """# MARS Playground
MARS fine-tunes an ordinary causal LM so that one forward pass can emit several tokens: append `B` mask
tokens, read `B` predictions, accept them left to right while the confidence passes **tau**. At tau = 1
it *is* the AR model. Tokens are coloured by the forward that produced them; hover for step and confidence.
"""


def resolve_defaults(mars_path=None, ar_path=None) -> tuple[str, str | None]:
    """Model sources: arguments, else MARS_MODEL / AR_MODEL, else the bundled pair.
    AR_MODEL="" (or ar_path="") means no AR baseline."""
    mars = mars_path or os.environ.get("MARS_MODEL") or BUNDLED_MARS
    if ar_path is not None:
        ar = ar_path or None
    elif "AR_MODEL" in os.environ:
        ar = os.environ["AR_MODEL"] or None
    elif mars == BUNDLED_MARS or os.path.isdir(BUNDLED_AR):
        ar = BUNDLED_AR if os.path.isdir(BUNDLED_AR) else None
    else:
        ar = None
    return mars, ar


def build_app(mars_path=None, ar_path=None, options: AppOptions | None = None, quantization=None,
              **overrides) -> gr.Blocks:
    """The Blocks app with its queue configured. `overrides` set AppOptions fields. The
    Playground instance is `demo.playground`. Raises ValueError if a model cannot be loaded."""
    opts = replace(options or AppOptions(), **overrides)
    mars_src, ar_src = resolve_defaults(mars_path, ar_path)
    quant = quantization or os.environ.get("MARS_QUANTIZATION", "none")
    pg = Playground(mars_src, ar_src, opts, quantization=quant)
    B = pg.default_block
    limit = dict(concurrency_limit=opts.concurrency_limit, concurrency_id="decode")

    with gr.Blocks(title="MARS Playground", analytics_enabled=False) as demo:
        session = gr.State(Session)
        gr.Markdown(INTRO)
        status = gr.Markdown(pg.model_status(), elem_id="model-status")
        with gr.Tabs():
            with gr.Tab("Playground", id="playground"):
                with gr.Row():
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Prompt (free text, or pick an example)", lines=3,
                                            elem_id="prompt", max_length=MAX_PROMPT_CHARS)
                        gr.Examples(_examples(), inputs=[prompt], label="Held-out synthetic problems "
                                    "(arithmetic, unit conversion, lists)", elem_id="examples")
                        with gr.Row():
                            gen_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                    with gr.Column(scale=2):
                        tau = gr.Slider(0.0, 1.0, value=0.95, step=0.01, elem_id="tau",
                                        label="tau (probability: accept while confidence >= tau; 1 = AR) — live")
                        block = gr.Slider(1, opts.max_block_size, value=B, step=1, label="block size B",
                                          elem_id="block-size")
                        with gr.Row():
                            metric = gr.Dropdown(list(METRICS), value="probability", label="acceptance metric")
                            cache = gr.Dropdown(list(CACHES), value="sliding", label="cache mode")
                        with gr.Row():
                            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
                            seed = gr.Number(value=0, precision=0, minimum=0, label="seed")
                        max_new = gr.Slider(1, opts.max_new_tokens_cap, value=opts.default_max_new_tokens, step=1,
                                            label="max new tokens", elem_id="max-new")
                        ar_side = gr.Radio(list(AR_SIDES), value=AR_SIDES[0] if pg.ar else AR_SIDES[1],
                                           label="AR side runs")
                with gr.Row(equal_height=False):
                    ar_html = gr.HTML(render.panel_html("ar", "AR", pg.ar.name if pg.ar else pg.mars.name, None,
                                                        None, "idle"), elem_id="ar-panel")
                    mars_html = gr.HTML(render.panel_html("mars", f"MARS (B = {B})", pg.mars.name, None, None,
                                                          "idle"), elem_id="mars-panel")
                compare = gr.HTML("", elem_id="compare")
                with gr.Row():
                    gauge = gr.Plot(plots.gauge(0.0, 0.0), label="throughput", elem_id="gauge")
                    steps_chart = gr.HTML(render.steps_chart_html([], [], B), elem_id="steps-chart")

            with gr.Tab("Frontier", id="frontier"):
                fig0, note0 = pg.frontier_initial()
                gr.Markdown("Accuracy and tokens/s against tokens per forward over a tau sweep on held-out "
                            "synthetic problems (the paper's Figure 3). Shown first: the model card's sweep.")
                frontier_plot = gr.Plot(fig0, elem_id="frontier-plot")
                frontier_note = gr.Markdown(note0, elem_id="frontier-note")
                with gr.Row():
                    f_n = gr.Slider(1, opts.frontier_max_n, value=min(20, opts.frontier_max_n), step=1,
                                    label="held-out problems N")
                    f_taus = gr.Textbox(", ".join(str(t) for t in (1.0, 0.9, 0.7, 0.5)), label="taus")
                    f_block = gr.Slider(1, opts.max_block_size, value=B, step=1, label="block size")
                    f_max = gr.Slider(8, opts.max_new_tokens_cap, value=min(128, opts.max_new_tokens_cap), step=8,
                                      label="max new tokens")
                f_btn = gr.Button("Run sweep", variant="primary", elem_id="frontier-run")

            with gr.Tab("Batch & KV cache", id="batch"):
                gr.Markdown("The same held-out prompts through AR (with KV cache) and MARS as one batch. "
                            "The timeline shows how many tokens each sample accepted per forward; grey cells are "
                            "idle samples (waiting at a cache-block boundary, or finished).")
                with gr.Row():
                    b_size = gr.Slider(1, opts.batch_max, value=min(4, opts.batch_max), step=1, label="batch size")
                    b_cache = gr.Dropdown(list(CACHES), value="block", label="MARS cache mode")
                    b_cblock = gr.Slider(4, 64, value=16, step=4, label="B_cache (block cache)")
                    b_tau = gr.Slider(0.0, 1.0, value=0.9, step=0.01, label="tau")
                    b_block = gr.Slider(1, opts.max_block_size, value=B, step=1, label="block size")
                    b_max = gr.Slider(8, opts.max_new_tokens_cap, value=min(64, opts.max_new_tokens_cap), step=8,
                                      label="max new tokens")
                b_btn = gr.Button("Run batch", variant="primary", elem_id="batch-run")
                b_summary = gr.Markdown(elem_id="batch-summary")
                b_plot = gr.Plot(elem_id="batch-plot")

            with gr.Tab("How it works", id="how"):
                gr.Markdown("**Training mask.** The sequence is fed as `[noisy | clean]`: the noisy copy has every "
                            "response token replaced by `[MASK]`. Clean tokens see clean tokens causally; a noisy "
                            "token sees the earlier noisy tokens of its own block and every clean token of earlier "
                            "blocks. Computed by `mars_training_mask` itself.")
                with gr.Row():
                    m_n = gr.Slider(2, 32, value=8, step=1, label="n (tokens)")
                    m_b = gr.Slider(1, 16, value=4, step=1, label="B (block size)")
                mask_plot = gr.Plot(plots.mask_figure(8, 4), elem_id="mask-plot")
                gr.Markdown("**Inference.** Each forward appends `B` masks after the prefix and accepts predictions "
                            "left to right while confident. Below: the forwards of your last MARS generation.")
                w_btn = gr.Button("Show my last generation", elem_id="window-show")
                window_plot = gr.Plot(plots.window_figure([], B), elem_id="window-plot")

            with gr.Tab("Models", id="models"):
                gr.Markdown(f"Choose the models for **your** session (others are not affected). The released "
                            f"checkpoints (`{RELEASED_MARS}`, `{RELEASED_AR}`) need network access. "
                            "No remote code is ever run. Environment variables for a Space: `MARS_MODEL`, "
                            "`AR_MODEL` (empty: none), `MARS_QUANTIZATION`.")
                preset = gr.Radio(list(PRESETS), value=PRESETS[0], label="models")
                with gr.Row():
                    mars_box = gr.Textbox(label="MARS model (folder or hub id, for 'custom')", elem_id="mars-source")
                    ar_box = gr.Textbox(label="AR baseline (optional)", elem_id="ar-source")
                quant = gr.Radio(list(QUANTIZATIONS), value="none", label="quantization (8/4-bit need a GPU "
                                 "and bitsandbytes)")
                load_btn = gr.Button("Load", variant="primary", elem_id="load-models")

        # events
        gen_evt = gen_btn.click(guard(pg.ui_generate),
                                [prompt, tau, block, metric, temperature, seed, max_new, cache, ar_side, session],
                                [ar_html, mars_html, gauge, steps_chart, compare], api_name="generate_stream",
                                show_progress="hidden", **limit)
        prompt.submit(guard(pg.ui_generate),
                      [prompt, tau, block, metric, temperature, seed, max_new, cache, ar_side, session],
                      [ar_html, mars_html, gauge, steps_chart, compare], api_visibility="private",
                      show_progress="hidden", **limit)
        tau.change(pg.set_tau, [tau, metric, session], None, queue=False, show_progress="hidden",
                   api_visibility="private")
        metric.change(pg.metric_changed, [metric], [tau], queue=False, api_visibility="private")
        stop_btn.click(pg.stop, [session], None, queue=False, api_visibility="private")
        gr.api(guard(pg.api_generate), api_name="generate", **limit)
        f_btn.click(guard(pg.frontier_run), [f_n, f_taus, f_block, f_max, session], [frontier_plot, frontier_note],
                    api_name="frontier", **limit)
        b_btn.click(guard(pg.batch_run), [b_size, b_cache, b_cblock, b_tau, b_block, b_max, session],
                    [b_summary, b_plot], api_name="batch", **limit)
        for c in (m_n, m_b):
            c.change(guard(pg.mask_plot), [m_n, m_b], [mask_plot], api_visibility="private", queue=False)
        gr.api(guard(_mask_api(pg)), api_name="mask")
        w_btn.click(guard(pg.window_plot), [session], [window_plot], api_name="window", queue=False)
        load_btn.click(guard(pg.load_models), [preset, mars_box, ar_box, quant, session],
                       [status, frontier_plot, frontier_note, block], api_name="load_models", concurrency_limit=1,
                       concurrency_id="load")
    demo.queue(max_size=opts.max_queue, default_concurrency_limit=opts.concurrency_limit)
    demo.playground = pg
    return demo


def _mask_api(pg: Playground):
    def mask(n: int = 8, block_size: int = 4) -> list:
        """The MARS training mask (2n x 2n, 1 = may attend) for the layout [noisy | clean]."""
        from mars_core import mars_training_mask

        n = as_int("n", n, 1, 64)
        block_size = as_int("block_size", block_size, 1, 32)
        return mars_training_mask(n, block_size).int().tolist()
    return mask


CSS = render.CSS


def launch(demo: gr.Blocks, **kwargs):
    """demo.launch with the app's CSS, no server-side rendering and no tracebacks to users."""
    kw = dict(css=CSS, ssr_mode=False, show_error=False)
    kw.update(kwargs)
    return demo.launch(**kw)


def _warm_up(pg: Playground) -> None:
    for loaded in filter(None, (pg.mars, pg.ar)):
        generate(loaded.model, loaded.tokenizer, ["Hi"], DecodeConfig(mode="mars", max_new_tokens=2,
                                                                      block_size=pg.default_block))


def main(argv: list[str]) -> int:
    name = argv[0] if argv else os.environ.get("MARS_MODEL", BUNDLED_MARS)
    if name == BUNDLED_MARS and not os.path.isdir(name):
        print("The bundled default models are not built yet. Build them with\n"
              "  python -m training.build_default --output runs/default --install assets/models\n"
              "or pass a model folder / hub id: python app.py FOLDER", file=sys.stderr)
        return 2
    try:
        demo = build_app(name)
    except ValueError as e:
        print(f"error: {scrub(str(e))}", file=sys.stderr)
        return 2
    _warm_up(demo.playground)
    launch(demo, prevent_thread_lock=True)
    print(f"MARS Playground ready in {time.perf_counter() - _T0:.1f} s (imports included)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
