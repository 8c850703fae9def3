"""What every tab shares: the app's limits, the model store with the default pair, and which
models a session uses."""
from __future__ import annotations

import os
from dataclasses import dataclass

from mars_core.cpu import PackedLinear

from .fastest import FastestConfigs
from .job_queue import JobQueue
from .models import Catalog, Loaded, ModelStore, operator_source
from .session import Session, SessionRegistry
from .trained import TRAINED, TrainedModels


@dataclass
class AppOptions:
    """Limits and knobs of one app instance (tests shrink them)."""

    max_new_tokens_cap: int = 512  # also at most half the model's context (see Core.max_new_cap)
    default_max_new_tokens: int = 256  # every held-out example needs fewer (the longest about 200)
    max_block_size: int = 16
    max_prompt_chars: int = 20000  # also at most 4 characters per context token (the token check is exact)
    max_seconds: float = 120.0  # per generation / batch / sweep; then it stops with a notice
    default_slow_ms: int = 50  # slow motion: a held-out example then takes a few seconds
    max_slow_ms: int = 500
    render_interval: float = 0.05  # seconds between UI updates while streaming
    concurrency_limit: int = 2  # Playground generations running at once
    job_concurrency: int = 1  # long jobs (Frontier, Batch, Under load) running at once, apart from generations
    job_queue: int = 8  # long jobs waiting, all visitors together (and model loads, apart); then refused
    jobs_per_session: int = 2  # long jobs one visitor (session) may have queued or running
    max_queue: int = 16  # generations waiting for a decode slot (Gradio's queue: nothing else waits there)
    frontier_max_n: int = 64
    batch_max: int = 16
    model_capacity: int = 2  # non-bundled models kept loaded
    device: str | None = None
    models_dir: str | None = None  # folder of models users may pick (default: $MARS_MODELS_DIR)
    allow_hub: bool = True  # users may load hub ids (owner/name)
    real_pair: bool = False  # prepare the real pair in the background (playground.real_pair); app.py turns it on
    # the Train tab (playground.tab_train): one run at a time, within this budget whatever a caller sends
    train_seconds: float = 240.0  # a run's budget: start-up, training and evaluations
    train_max_steps: int = 400
    train_threads: int = max(1, (os.cpu_count() or 2) - 1)  # leaves a core to the visitors' generations
    train_memory_mb: float = 3000.0  # a run's process is ended above this
    train_eval_n: int = 16  # held-out problems decoded at each of a run's evaluations
    trained_capacity: int = 8  # visitors' trained models held in memory, all sessions together


class Core:
    """The default models (pinned in the store) and the per-session model choice."""

    def __init__(self, mars_source: str, ar_source: str | None, options: AppOptions | None = None,
                 store: ModelStore | None = None, quantization: str = "none"):
        self.opts = options or AppOptions()
        self.store = store or ModelStore(self.opts.model_capacity, self.opts.device)
        self.mars_source = operator_source(mars_source)
        self.ar_source = operator_source(ar_source) or None
        self.quantization = quantization
        self.mars = self.store.get(self.mars_source, quantization, pin=True)
        self.ar = self.store.get(self.ar_source, quantization, pin=True) if self.ar_source else None
        self.default_block = self.mars.trained_block_size or 4
        self.sessions = SessionRegistry()
        self.catalog = Catalog([self.mars_source, self.ar_source], self.opts.models_dir, self.opts.allow_hub)
        self._vocab_same: dict[tuple[int, int], bool] = {}
        self.real = None  # a playground.real_pair.RealPair when the app prepares the real pair
        # long jobs and model loads wait here, not in Gradio's queue (see playground.job_queue);
        # training, when it comes, is a kind of long job: one run at a time, whatever job_concurrency
        self.jobs = JobQueue(self.opts.job_concurrency, self.opts.job_queue, self.opts.jobs_per_session,
                             kind_slots={"train": 1})
        # loads apart: a visitor switching models should not wait behind a two-minute sweep
        self.loads = JobQueue(1, self.opts.job_queue, 1, what="model load")
        # the "exact, fastest here" mode's configuration per MARS model (playground.fastest)
        self.fastest = FastestConfigs()
        self.trained = TrainedModels(self.opts.trained_capacity)  # visitors' trained models (memory only)

    def page_defaults(self, session: Session) -> None:
        """When a session starts (a page loads, or an API client's first call): one that has not
        chosen models starts on the real pair once it is ready, and keeps the pair it started on."""
        session.started = True
        if self.real is not None and self.real.ready and session.mars_source is None:
            session.mars_source, session.ar_source = self.real.mars, self.real.ar
            session.quantization = self.real.quantization

    def session_of(self, request) -> Session:
        """The session of an endpoint that gets the request but no `gr.State` (a `gr.api` endpoint):
        the one the client's other calls use, or a new one, remembered, on the page's default pair."""
        key = getattr(request, "session_hash", None)
        session = self.sessions.get(key)
        if not session.started:
            self.page_defaults(session)
            self.sessions.remember(key, session)
        return session

    def models_for(self, session: Session | None) -> tuple[Loaded, Loaded | None]:
        # an API client never fires the page's load event: its session starts at its first call, on the
        # same pair a page opened then would get
        if session is not None and not session.started:
            self.page_defaults(session)
        if session is not None and session.mars_source == TRAINED:
            mine = self.trained.get(session)
            if mine is not None:
                return mine, self.store.get(session.ar_source)
            session.mars_source = session.ar_source = None  # dropped at the server's limit: the defaults
        if session is None or session.mars_source is None:
            return self.mars, self.ar
        q = session.quantization
        mars = self.store.get(session.mars_source, q)
        ar = self.store.get(session.ar_source, q) if session.ar_source else None
        return mars, ar

    def context(self, session: Session | None = None) -> int:
        """Positions the session's models read (the smaller of the pair; 4096 if unknown)."""
        known = [m.context for m in self.models_for(session) if m is not None and m.context]
        return min(known) if known else 4096

    def max_new_cap(self, session: Session | None = None) -> int:
        """The max-new-tokens limit: the app's cap, and at most half the context (room for a prompt)."""
        return max(1, min(self.opts.max_new_tokens_cap, self.context(session) // 2))

    def prompt_char_cap(self, session: Session | None = None) -> int:
        return min(self.opts.max_prompt_chars, 4 * self.context(session))

    def same_vocab(self, a: Loaded, b: Loaded) -> bool:
        key = (id(a.tokenizer), id(b.tokenizer))
        if key not in self._vocab_same:
            self._vocab_same[key] = a.tokenizer is b.tokenizer or a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
        return self._vocab_same[key]

    def model_status(self, session: Session | None = None) -> str:
        mars, ar = self.models_for(session)
        dev = str(next(mars.model.parameters()).device)
        dtype = str(next(mars.model.parameters()).dtype).replace("torch.", "")
        packed = " (oneDNN prepacked)" if any(isinstance(m, PackedLinear) for m in mars.model.modules()) else ""
        line = (f"**MARS model:** `{mars.name}` · **AR baseline:** `{ar.name if ar else '(none: MARS at 1 token/step)'}`"
                f" · quantization: {mars.quantization} · device: {dev} · {dtype}{packed}")
        note = getattr(mars.model, "mars_dtype_note", None)
        if note:
            line += f"  \n{note}"
        if self.real is not None and mars.source != self.real.mars:
            line += f"  \n{self.real.message}"
        return line
